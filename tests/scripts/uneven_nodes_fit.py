"""One rank of a Lightning fit under torchrun with nodes of different sizes (tests/test_uneven_nodes.py).

argv: out_dir. Each rank trains 4 steps with batch_sizes [3, 9, 6] (G = 6 x 3 = 18) and saves its weights.
"""

import os
import sys
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from oracle import make_data, make_net

import hetero_strategy


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = make_net()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x).squeeze(1), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    model = Regressor()
    trainer = L.Trainer(accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]), num_nodes=2,
                        strategy=hetero_strategy.HeteroStrategy(batch_sizes=[3, 9, 6]), max_steps=4, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, DataLoader(make_data(64), batch_size=6, shuffle=True))
    torch.save({"rank": trainer.global_rank, "world": trainer.world_size, "node": trainer.node_rank,
                "weights": [p.detach() for p in model.net.parameters()]}, Path(sys.argv[1]) / f"rank{trainer.global_rank}.pt")
