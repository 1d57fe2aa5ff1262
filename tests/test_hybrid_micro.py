"""mode="hybrid" with per-rank micro-batching (a share above its memory cap runs as passes), in
Lightning and in Accelerate, on 2 gloo ranks.

Oracle: one process, momentum SGD on the global batch G = 8 in order (plain PyTorch, written out
here). H = 1 runs every step through the averaging path; rank 1's share 5 with cap 2 runs as
passes of 2, 2 and 1 (``pass_sizes``), which must not change a single step.
"""

from __future__ import annotations

import torch
from dist_utils import run_distributed
from lit_models import Regressor, loader, make_data, make_net, trainer_kwargs
from torch import nn
from torch.utils.data import DataLoader

LR, MOMENTUM = 0.05, 0.9
HYBRID = dict(mode="hybrid", periods=[1, 1], plateau_thresholds=[0.5], local_clip_norm=None,
              batch_sizes=[3, 5], max_batch_sizes=[3, 2])


def _oracle(steps: int) -> nn.Module:
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    x, y = make_data(64).tensors
    for s in range(steps):
        idx = slice((8 * s) % 64, (8 * s) % 64 + 8)
        opt.zero_grad()
        nn.functional.mse_loss(net(x[idx]).squeeze(1), y[idx]).backward()
        opt.step()
    return net


class _Momentum(Regressor):  # records every pass it trains on in ``seen``
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR, momentum=MOMENTUM)


def _lightning(rank: int, world: int) -> dict:
    import lightning as L

    from hetero_strategy import HeteroStrategy

    model = _Momentum()
    trainer = L.Trainer(strategy=HeteroStrategy(**HYBRID), max_epochs=2, **trainer_kwargs())
    trainer.fit(model, loader(make_data(64), 4))
    return {"weights": [p.detach().clone() for p in model.net.parameters()], "passes": model.seen}


def _accelerate(rank: int, world: int) -> dict:
    from accelerate import Accelerator

    from hetero_strategy.accelerate import HeteroPlugin

    accelerator = Accelerator(cpu=True)
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    plugin = HeteroPlugin(**HYBRID)
    model, opt, data = plugin.prepare(accelerator, net, opt, DataLoader(make_data(64), batch_size=4))
    passes = []
    for _ in range(2):
        for batch in data:
            for x, y in plugin.micro_batches(batch):
                passes.append(len(x))
                plugin.backward(nn.functional.mse_loss(model(x).squeeze(1), y))
            opt.step()
            opt.zero_grad()
    plugin.close()
    return {"weights": [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()], "passes": passes}


def _check(out: list[dict]) -> None:
    assert out[0]["passes"] == [3] * 16 and out[1]["passes"] == [2, 2, 1] * 16  # rank 1 in 3 passes a step
    oracle = _oracle(16)
    for rank in range(2):
        for got, want in zip(out[rank]["weights"], oracle.parameters(), strict=True):
            torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)
    for a, b in zip(out[0]["weights"], out[1]["weights"], strict=True):
        assert torch.equal(a, b)


def test_hybrid_with_a_micro_batched_rank_through_lightning_equals_one_process_momentum_sgd():
    _check(run_distributed(_lightning, 2, timeout=120))


def test_hybrid_with_a_micro_batched_rank_through_accelerate_equals_one_process_momentum_sgd():
    _check(run_distributed(_accelerate, 2, timeout=120))
