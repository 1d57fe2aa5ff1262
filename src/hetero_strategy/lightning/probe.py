"""Time a LightningModule's own training_step + backward on this rank, leaving no trace."""

from __future__ import annotations

from typing import Any

import torch

from hetero_strategy.balance.probe import StepCost, fit_step_cost, measure_step_seconds

__all__ = ["probe_step_cost"]


def probe_step_cost(module: Any, batches: list[tuple[Any, int]], steps: int, with_comm: bool = True
                    ) -> StepCost | None:
    """This rank's step cost from forward+backward of ``module.training_step`` at two batch sizes.

    ``batches`` holds (batch, samples) pairs, e.g. the loader's batch and half of it; the two
    timings give the per-sample rate and the per-step fixed part (:class:`StepCost`). With
    ``with_comm`` a gradient-sized all-reduce runs beside each timed backward pass, so a rank whose
    communication competes with its compute (CPU/gloo) is measured as DDP will run it. Every rank
    must call this with the same sample counts and ``steps``. None under manual optimization.

    The probe must not change training: RNG state, buffers (e.g. batch-norm statistics) and
    gradients are restored, and ``self.log`` calls inside training_step are ignored.
    """
    if not module.automatic_optimization:
        return None  # training_step would step optimizers itself
    rng = torch.random.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    buffers = {name: b.detach().clone() for name, b in module.named_buffers()}
    saved_log, saved_log_dict = module.log, module.log_dict
    module.log = lambda *a, **k: None
    module.log_dict = lambda *a, **k: None
    was_training = module.training
    module.train()

    def step(batch: Any, start_comm: Any) -> None:
        out = module.training_step(batch, 0)
        loss = out["loss"] if isinstance(out, dict) else out
        start_comm()  # DDP exchanges gradients during backward, not during forward
        loss.backward()

    params = [p for p in module.parameters() if p.requires_grad]
    comm_numel = sum(p.numel() for p in params) if with_comm else 0
    device = params[0].device if params else None
    try:
        # Two warm-up rounds: the first steps at a new shape are slow (kernel selection, allocator
        # growth) and would bias the fitted fixed cost.
        fns = [lambda start, b=b: step(b, start) for b, _ in batches]
        seconds = measure_step_seconds(fns, steps=steps, warmup=2, comm_numel=comm_numel, device=device)
        points = [(n, t) for (_, n), t in zip(batches, seconds)]
        return fit_step_cost(points) if len(points) > 1 else StepCost(points[0][0] / max(points[0][1], 1e-9))
    finally:
        module.log, module.log_dict = saved_log, saved_log_dict
        del module.log, module.log_dict  # drop the instance attributes; the class methods return
        module.train(was_training)
        with torch.no_grad():
            for name, b in module.named_buffers():
                b.copy_(buffers[name])
        for p in module.parameters():
            p.grad = None
        torch.random.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
