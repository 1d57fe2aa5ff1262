"""Time a LightningModule's own training_step + backward on this rank, leaving no trace."""

from __future__ import annotations

from typing import Any

import torch

from hetero_strategy.balance.probe import measure_samples_per_s

__all__ = ["probe_training_speed"]


def probe_training_speed(module: Any, batch: Any, samples: int, steps: int) -> float | None:
    """Samples/s of forward+backward of ``module.training_step`` (None under manual optimization).

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

    def step() -> None:
        out = module.training_step(batch, 0)
        loss = out["loss"] if isinstance(out, dict) else out
        loss.backward()

    try:
        return measure_samples_per_s(step, samples, steps=steps)
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
