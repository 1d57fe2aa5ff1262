"""One rank of a Lightning fit under torchrun with nodes of different sizes (tests/test_uneven_nodes.py).

argv: out_dir [lightning|ddp]. Each rank trains 4 steps with batch_sizes [3, 9, 6] (G = 6 x 3 = 18)
and saves its weights. ``ddp`` runs the same job on bare torch DDP + HeteroRuntime (no Lightning
import: a third of the start-up time), for a test of the launcher rather than of the adapter.
"""

import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from oracle import make_data, make_net

import hetero_strategy


def fit_lightning(out: Path) -> None:
    import lightning as L

    class Regressor(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_net()

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x).squeeze(1), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    model = Regressor()
    trainer = L.Trainer(accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]), num_nodes=2,
                        strategy=hetero_strategy.HeteroStrategy(batch_sizes=[3, 9, 6]), max_steps=4, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, DataLoader(make_data(64), batch_size=6, shuffle=True))
    torch.save({"rank": trainer.global_rank, "world": trainer.world_size, "node": trainer.node_rank,
                "weights": [p.detach() for p in model.net.parameters()]}, out / f"rank{trainer.global_rank}.pt")


def fit_ddp(out: Path) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from hetero_strategy.config import HeteroConfig
    from hetero_strategy.runtime import HeteroRuntime

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    net = make_net()
    model = DistributedDataParallel(net)
    runtime = HeteroRuntime(HeteroConfig.from_flat(batch_sizes=[3, 9, 6]), rank, world)
    loader = runtime.train_loader(DataLoader(make_data(64), batch_size=6, shuffle=True), seed=0)
    runtime.register_hook(model, max_steps=4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (x, y) in zip(range(4), loader):
        runtime.batch_start()
        torch.nn.functional.mse_loss(model(x).squeeze(1), y).backward()
        runtime.backward_end()
        opt.step()
        opt.zero_grad(set_to_none=True)
        runtime.step_end(step)
    torch.save({"rank": rank, "world": world, "node": int(os.environ["GROUP_RANK"]),
                "weights": [p.detach() for p in net.parameters()]}, out / f"rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    (fit_ddp if sys.argv[2:] == ["ddp"] else fit_lightning)(Path(sys.argv[1]))
