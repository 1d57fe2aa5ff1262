"""A few Accelerate steps through HeteroPlugin, for the wizard's launch test (tests/test_wizard.py).

Run it with the command ``hetero-strategy config`` prints, e.g.::

    HETERO_STRATEGY_CONFIG=hetero.yaml ACCELERATE_USE_CPU=true \
        accelerate launch --config_file accelerate.yaml tests/scripts/wizard_train.py

Each rank prints one ``rank R/W world W ...`` line after joining, one ``rank R/W batch b`` line per
step and a ``config`` line with the hetero settings HeteroPlugin read from $HETERO_STRATEGY_CONFIG.
"""

from __future__ import annotations

import gc
import os

import torch
import torch.distributed as dist
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

from hetero_strategy.accelerate import HeteroPlugin


def say(line: str) -> None:
    # NOTE: one write() per line: both ranks share the launcher's stdout pipe, and print() writes
    # the text and its newline separately, so two ranks' lines could run together.
    os.write(1, (line + "\n").encode())


def main() -> None:
    accelerator = Accelerator()
    rank, world = accelerator.process_index, accelerator.num_processes
    torch_world = dist.get_world_size() if dist.is_initialized() else 1
    say(f"rank {rank}/{world} world {torch_world} type {accelerator.distributed_type.value}")
    plugin = HeteroPlugin()  # reads $HETERO_STRATEGY_CONFIG
    cfg = plugin.config
    say(f"rank {rank}/{world} config {os.environ.get('HETERO_STRATEGY_CONFIG')} "
        f"capacities={cfg.balance.capacities} compression={cfg.compression.method} "
        f"calibrate={cfg.calibration.calibrate}")

    torch.manual_seed(0)
    x = torch.randn(32, 4)  # (N, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])  # (N, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)  # mean per-rank batch B = 4
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer, loader = plugin.prepare(accelerator, model, optimizer, loader)
    for xb, yb in loader:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        say(f"rank {rank}/{world} batch {len(xb)} loss {loss.item():.4f}")
    accelerator.wait_for_everyone()
    say(f"rank {rank}/{world} done")
    # NOTE: release the DDP model while the interpreter is alive (gloo work freed during
    # finalization can abort the process; pytorch/pytorch#179291), then destroy the group.
    del model, optimizer, loader
    accelerator.free_memory()
    gc.collect()
    accelerator.end_training()


if __name__ == "__main__":
    main()
