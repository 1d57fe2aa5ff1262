"""Benchmark implementations behind ``hetero-strategy bench <mode>`` (one module per mode).

Example::

    hetero-strategy bench compression --json benchmarks/results/compression.json
"""
