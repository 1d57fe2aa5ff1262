"""Small, self-contained workloads for the demo, benchmarks and tests (no hub downloads)."""
