"""What HeteroStrategy logs: the runtime's per-rank metrics, at Lightning's logging cadence."""

from __future__ import annotations

from typing import Any

__all__ = ["log_runtime_metrics"]


def log_runtime_metrics(module: Any, trainer: Any, runtime: Any) -> None:
    """``module.log_dict`` of ``runtime.metrics()`` at Lightning's logging steps (collective: the
    metrics are all-gathered, at points every rank reaches alike)."""
    if (trainer is not None and runtime.sampler is not None and trainer.logger is not None
            and runtime.metrics_point(trainer.global_step, trainer.log_every_n_steps)):
        with runtime.phase("metrics"):
            metrics = runtime.metrics()
        module.log_dict(metrics, on_step=True, on_epoch=False, sync_dist=False)
