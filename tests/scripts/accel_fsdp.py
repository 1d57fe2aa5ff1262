"""HeteroPlugin on Accelerate's FSDP2 for tests/test_fsdp_accelerate.py, under torchrun (2 gloo ranks).

    torchrun --nproc-per-node 2 accel_fsdp.py OUT_DIR
    torchrun --nproc-per-node 3 accel_fsdp.py OUT_DIR     # 2/3/4 of a global batch of 9, plain steps only
    accelerate launch --config_file accelerate.yaml accel_fsdp.py OUT_DIR   # the wizard's FSDP2 file

NOTE: Accelerate 1.16 turns FullyShardedDataParallelPlugin into DistributedType.FSDP only for
GPU-like distributed types (accelerate/state.py: MULTI_GPU, MULTI_NPU ...); with cpu=True it
stays MULTI_CPU and wraps the model in DDP. FSDP2 itself runs on gloo, so :func:`cpu_fsdp2`
switches the Accelerator's state to FSDP2 before prepare: from there on it is Accelerate's own
FSDP2 path (fully_shard of the model, its optimizer, accumulate's set_requires_gradient_sync,
save_state's sharded model and optimizer files).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lit_models import error_of
from oracle import make_data, make_net

from hetero_strategy.accelerate import HeteroPlugin


def cpu_fsdp2(accumulate: int = 1) -> Accelerator:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulate)
    # NOTE: PartialState's too, as AcceleratorState's own init does for FSDP on GPUs: any later
    # AcceleratorState() copies PartialState's type back (prepare makes one), and save_state or
    # load_state would then take the DDP path
    accelerator.state.distributed_type = PartialState().distributed_type = DistributedType.FSDP
    # under `accelerate launch --config_file` the plugin reads the file's fsdp_config from the
    # environment the launcher set (FSDP_VERSION, ...), as it would on GPUs
    from_file = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    accelerator.state.fsdp_plugin = FullyShardedDataParallelPlugin() if from_file else \
        FullyShardedDataParallelPlugin(fsdp_version=2)
    return accelerator


def fit(steps: int, accumulate: int = 1, weighted: bool = True, micro: bool = False, momentum: float = 0.0,
        save_state: Path | None = None, load_state: Path | None = None, batch_sizes: tuple = (3, 5),
        **fields) -> dict:
    """``steps`` optimizer steps in all (a resumed run goes on from where its checkpoint stood);
    ``save_state``/``load_state``: Accelerate's own checkpoint at the end / after prepare."""
    accelerator = cpu_fsdp2(accumulate)
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=momentum)
    plugin = HeteroPlugin(batch_sizes=list(batch_sizes), **fields)
    mean = sum(batch_sizes) // len(batch_sizes)
    model, opt, loader = plugin.prepare(accelerator, net, opt, DataLoader(make_data(80), batch_size=mean))
    if load_state is not None:
        accelerator.load_state(str(load_state))
    seen, done = [], plugin.runtime.steps
    start = done
    while done < steps:
        for x, y in loader:
            with accelerator.accumulate(model):
                for px, py in plugin.micro_batches((x, y)) if micro else [(x, y)]:
                    seen.append(len(px))
                    loss = nn.functional.mse_loss(model(px).squeeze(1), py)
                    plugin.backward(loss) if weighted else accelerator.backward(loss)
                opt.step()
                opt.zero_grad()
            done += accelerator.sync_gradients
            if done == steps:
                break
    from torch.distributed.tensor import DTensor

    weights = [(p.full_tensor() if isinstance(p, DTensor) else p).detach().clone() for p in model.parameters()]
    if save_state is not None:
        accelerator.save_state(str(save_state))
    plugin.close()
    return {"weights": weights, "seen": seen, "sharded": type(next(model.parameters())).__name__, "start": start}


def main() -> None:
    out_dir = Path(sys.argv[1])
    rank = int(os.environ["RANK"])  # set by torchrun and by accelerate launch
    if int(os.environ["WORLD_SIZE"]) == 3:
        torch.save({"plain": fit(8, batch_sizes=(2, 3, 4))}, out_dir / f"rank{rank}.pt")
        torch.distributed.destroy_process_group()
        return
    # rank 1's share of 5 as passes of 2, 2 and 1 (cap 2), alone and under accumulation
    result = {"plain": fit(8), "accumulate": fit(4, accumulate=2),
              "micro": fit(8, micro=True, max_batch_sizes=[8, 2]),
              "micro_accumulate": fit(4, accumulate=2, micro=True, max_batch_sizes=[8, 2]),
              "unweighted": error_of(lambda: fit(1, weighted=False)),
              "topk": error_of(lambda: fit(1, compression="topk"))}
    # sharded momentum through a stop and a resume: HeteroPlugin's own checkpoints, and Accelerate's
    every4 = {"momentum": 0.9, "checkpoint_dir": str(out_dir / "ckpt"), "checkpoint_every_steps": 4,
              "checkpoint_every_s": None}
    fit(4, **every4)
    result["resumed"] = fit(8, **every4)
    fit(4, momentum=0.9, save_state=out_dir / "state")
    result["load_state"] = fit(8, momentum=0.9, load_state=out_dir / "state")
    result["fsdp_version"] = cpu_fsdp2().state.fsdp_plugin.fsdp_version
    torch.save(result, out_dir / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
