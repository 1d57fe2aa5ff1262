"""mode="hybrid" through HeteroStrategy (Lightning) on 2 gloo ranks, against independent oracles.

* H = 1 through the averaging path, equal speeds, momentum SGD: one-process momentum SGD on the
  global batch (written out here in plain PyTorch);
* H = 4 with a slow rank 1 over 3 epochs: unequal local step counts at the syncs, the phase switch
  at the validation that the hand-scripted losses' mean plateaus at, one model on both ranks;
* what Lightning cannot do in local phases is refused with a ConfigError naming the field.
"""

from __future__ import annotations

import datetime
import time

import pytest
import torch
from dist_utils import run_distributed
from lit_models import Regressor, error_of, loader, make_data, make_net, trainer_kwargs
from torch import nn

LR, MOMENTUM = 0.05, 0.9


class _Momentum(Regressor):
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR, momentum=MOMENTUM)


def _momentum_oracle(n: int, global_batch: int, steps: int) -> nn.Module:
    """One process, batch G in order, momentum SGD: what the 2 ranks must reproduce."""
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    x, y = make_data(n).tensors
    for s in range(steps):
        idx = slice((s * global_batch) % n, (s * global_batch) % n + global_batch)
        opt.zero_grad()
        nn.functional.mse_loss(net(x[idx]).squeeze(1), y[idx]).backward()
        opt.step()
    return net


def _h1(rank: int, world: int) -> dict:
    import lightning as L

    from hetero_strategy import HeteroStrategy

    strategy = HeteroStrategy(mode="hybrid", periods=[1, 1], plateau_thresholds=[0.5], local_clip_norm=None,
                              batch_sizes=[3, 5])
    model = _Momentum()
    trainer = L.Trainer(strategy=strategy, max_epochs=2, **trainer_kwargs())
    trainer.fit(model, loader(make_data(64), 4))  # G = 8: 8 steps an epoch
    hybrid = strategy.runtime.hybrid
    return {"weights": [p.detach().clone() for p in model.net.parameters()], "seen": model.seen,
            "phase": hybrid.schedule.phase, "syncs": hybrid.controller.syncs, "weights_r": hybrid.controller.last}


def test_h1_through_lightning_equals_one_process_momentum_sgd():
    out = run_distributed(_h1, 2, timeout=90)
    assert out[0]["seen"] == [3] * 16 and out[1]["seen"] == [5] * 16
    assert out[0]["phase"] == 0  # no validation: every step went through the averaging path
    assert out[0]["syncs"] >= 16  # one per step, plus the epochs' joins
    oracle = _momentum_oracle(64, 8, 16)
    for rank in range(2):
        for got, want in zip(out[rank]["weights"], oracle.parameters(), strict=True):
            torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)
    for a, b in zip(out[0]["weights"], out[1]["weights"], strict=True):
        assert torch.equal(a, b)


# ---- H = 4, a slow rank, validation feeding the phase schedule ---------------------------------
# Mean over the ranks (rank 0 gets +SPREAD, rank 1 -SPREAD): evaluation 1 changes 50% (no plateau),
# evaluation 2 changes 2% < 5% (N = 1): the switch to synchronous DDP comes at epoch 2's validation.
MEAN, SPREAD = [1.0, 0.5, 0.49], [0.3, 0.2, 0.1]
EPOCHS = 3


class _Scripted(Regressor):
    """Rank 1 is slow; validation logs a scripted loss; the syncs' step counts are recorded."""

    def __init__(self, monitor: str = "val_loss", sync_train_log: bool = False, sync_batch_end_log: bool = False):
        super().__init__(lr=0.05)
        self.monitor, self.sync_train_log, self.sync_batch_end_log = monitor, sync_train_log, sync_batch_end_log
        self.syncs: list[list[int]] = []
        self.phases: list[int] = []

    def on_train_start(self):
        controller = self.trainer.strategy.runtime.hybrid.controller
        original = controller.sync

        def sync(joined: bool = False) -> bool:  # a recording wrapper, no change to the logic
            done = original(joined)
            self.syncs.append(list(controller.last["steps"]))
            return done

        controller.sync = sync

    def on_train_epoch_start(self):
        self.phases.append(self.trainer.strategy.runtime.hybrid.schedule.phase)

    def training_step(self, batch, batch_idx):
        if self.global_rank == 1:
            time.sleep(0.02)  # the slow device
        loss = super().training_step(batch, batch_idx)
        if self.sync_train_log:
            self.log("synced_loss", loss, sync_dist=True)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.sync_batch_end_log:  # after the strategy's optimizer_step: still inside the batch
            self.log("synced_end", outputs["loss"], sync_dist=True)

    def validation_step(self, batch, batch_idx):
        sign = 1 if self.global_rank == 0 else -1
        e = self.current_epoch
        self.log(self.monitor, MEAN[e] + sign * SPREAD[e])


def _slow(rank: int, world: int, tmp: str) -> dict:
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    from hetero_strategy import HeteroStrategy

    strategy = HeteroStrategy(mode="hybrid", periods=[4, 1], plateau_thresholds=[0.05], plateau_evals=1,
                              max_staleness=3, batch_sizes=[4, 4])
    model = _Scripted()
    # metrics every synced point (log_every_n_steps=1): an all-gather that must not meet a period's sync
    trainer = L.Trainer(strategy=strategy, max_epochs=EPOCHS, log_every_n_steps=1,
                        **trainer_kwargs(logger=CSVLogger(tmp, name="hybrid")))
    trainer.fit(model, loader(make_data(64), 4), loader(make_data(8, seed=2), 2))
    schedule = strategy.runtime.hybrid.schedule
    # max_steps inside epoch 1: the run stops mid-epoch, no validation; the join there ends it on one model
    stop = _Scripted()
    strategy = HeteroStrategy(mode="hybrid", periods=[4, 1], plateau_thresholds=[0.05], batch_sizes=[4, 4])
    capped = L.Trainer(strategy=strategy, max_steps=13, **trainer_kwargs())
    capped.fit(stop, loader(make_data(64), 4), loader(make_data(8, seed=2), 2))
    return {"weights": [p.detach().clone() for p in model.net.parameters()], "syncs": model.syncs,
            "phases": model.phases, "switches": schedule.switches, "phase": schedule.phase,
            "global_step": trainer.global_step, "capped": [p.detach().clone() for p in stop.net.parameters()],
            "capped_step": capped.global_step, "capped_syncs": stop.syncs, "log_dir": trainer.logger.log_dir}


def test_slow_rank_local_phase_switches_at_the_scripted_plateau_and_ends_on_one_model(tmp_path):
    import csv
    import os

    out = run_distributed(_slow, 2, str(tmp_path), timeout=120)
    with open(os.path.join(out[0]["log_dir"], "metrics.csv")) as f:
        rows = [r for r in csv.DictReader(f) if r.get("hybrid/phase")]
    assert rows and {"hybrid/steps_r0", "hybrid/steps_r1", "hetero/step_s_r1"} <= rows[0].keys()
    assert any(r["hybrid/steps_r0"] != r["hybrid/steps_r1"] for r in rows)  # logged at unequal step counts
    for rank in range(2):
        assert out[rank]["global_step"] == EPOCHS * 8  # every rank the same batches per epoch
        assert out[rank]["phases"] == [0, 0, 0] and out[rank]["phase"] == 1
        assert [round(s["loss"], 6) for s in out[rank]["switches"]] == [0.49]  # at epoch 2's validation
    assert out[0]["syncs"] == out[1]["syncs"]  # the all-gathered counts, seen alike
    steps = out[0]["syncs"]
    assert any(s[0] != s[1] for s in steps), steps  # the fast rank took more local steps
    assert all(max(s) <= 4 for s in steps), steps  # H
    both = [s for s in steps if min(s) > 0]  # not the syncs a joined rank (0 steps) waits through
    assert both and all(max(s) - min(s) <= 3 for s in both), steps  # the staleness bound
    assert any(s[0] == 0 and s[1] > 0 for s in steps), steps  # rank 0 ran out first and waited in join
    assert sum(s[0] for s in steps) == sum(s[1] for s in steps) == EPOCHS * 8  # every batch in some sync
    for a, b in zip(out[0]["weights"], out[1]["weights"], strict=True):
        assert torch.equal(a, b)  # the final join: one model
    assert out[0]["capped_step"] == out[1]["capped_step"] == 13
    assert sum(s[0] for s in out[0]["capped_syncs"]) == sum(s[1] for s in out[0]["capped_syncs"]) == 13
    for a, b in zip(out[0]["capped"], out[1]["capped"], strict=True):
        assert torch.equal(a, b)  # the join at max_steps: one model


# ---- what local phases cannot do is refused with the field, the value and the fix -------------


def _refusals(rank: int, world: int) -> dict:
    import lightning as L
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint

    class SyncedAtBatchStart(Callback):  # Lightning runs it before the strategy's on_train_batch_start
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            pl_module.log("synced_start", float(batch_idx), sync_dist=True)

    from hetero_strategy import HeteroStrategy

    def fit(model, strategy_kw=None, **kw) -> str:
        strategy = HeteroStrategy(mode="hybrid", periods=[4, 1], plateau_thresholds=[0.05], batch_sizes=[4, 4],
                                  **(strategy_kw or {}))
        trainer = L.Trainer(strategy=strategy, max_epochs=1, **trainer_kwargs(**kw))
        return error_of(lambda: trainer.fit(model, loader(make_data(32), 4), loader(make_data(8, seed=2), 2)))

    return {
        "val_interval": fit(_Scripted(), val_check_interval=0.5),
        "ckpt_steps": fit(_Scripted(), enable_checkpointing=True, callbacks=[ModelCheckpoint(every_n_train_steps=2)]),
        "monitor": fit(_Scripted(monitor="val_acc")),
        "sync_log": fit(_Scripted(sync_train_log=True)),
        "sync_log_end": fit(_Scripted(sync_batch_end_log=True)),
        "sync_log_start": fit(_Scripted(), callbacks=[SyncedAtBatchStart()]),
        "timer": fit(_Scripted(), max_time="00:00:01:00"),
        # NOTE: a zero interval is on too: Lightning then broadcasts rank 0's clock after every batch
        "ckpt_zero_time": fit(_Scripted(), enable_checkpointing=True,
                              callbacks=[ModelCheckpoint(train_time_interval=datetime.timedelta(0))]),
        "stopped": _stopped_mid_epoch(),
    }


class _Predicts(Regressor):
    def forward(self, x):
        return self.net(x)

    def predict_step(self, batch, batch_idx):
        return self(batch[0])


def _evaluate_only(rank: int, world: int) -> dict:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from hetero_strategy import HeteroStrategy

    # what fit refuses in hybrid mode (validation mid-epoch, step-based checkpoints) has no steps to
    # break in validate or predict, and a module without validation_step needs no phase schedule
    strategy = HeteroStrategy(mode="hybrid", batch_sizes=[4, 4])
    trainer = L.Trainer(strategy=strategy, callbacks=[ModelCheckpoint(every_n_train_steps=2)],
                        **trainer_kwargs(val_check_interval=0.5, enable_checkpointing=True))
    metrics = trainer.validate(_Scripted(), loader(make_data(8, seed=2), 2))
    predicted = trainer.predict(_Predicts(), loader(make_data(8, seed=3), 2))
    return {"val_loss": metrics[0]["val_loss"], "predicted": sum(len(p) for p in predicted)}


def test_validate_and_predict_are_not_held_to_the_fit_refusals():
    for rank, r in enumerate(run_distributed(_evaluate_only, 2, timeout=60)):
        assert r["val_loss"] == pytest.approx(MEAN[0] + (1 - 2 * rank) * SPREAD[0])  # each rank's scripted loss
        assert r["predicted"] == 4  # half of the 8 samples on each rank


class _StopsEarly(_Scripted):
    def on_train_batch_end(self, outputs, batch, batch_idx):
        if batch_idx == 2:  # every rank, inside a period: Lightning validates, then ends the run
            self.trainer.should_stop = True


def _stopped_mid_epoch() -> list:
    import lightning as L

    from hetero_strategy import HeteroStrategy

    model = _StopsEarly()
    strategy = HeteroStrategy(mode="hybrid", periods=[4, 1], plateau_thresholds=[0.05], batch_sizes=[4, 4])
    trainer = L.Trainer(strategy=strategy, max_epochs=2, **trainer_kwargs())
    trainer.fit(model, loader(make_data(32), 4), loader(make_data(8, seed=2), 2))
    return [p.detach().clone() for p in model.net.parameters()]


def test_what_local_phases_cannot_do_is_refused_not_hung():
    out = run_distributed(_refusals, 2, timeout=120)
    for rank in range(2):  # every rank refuses alike: nobody is left waiting in a collective
        r = out[rank]
        assert r["val_interval"].startswith("ConfigError: val_check_interval=0.5") and "1.0" in r["val_interval"]
        assert r["ckpt_steps"].startswith("ConfigError: ModelCheckpoint(every_n_train_steps=2)")
        assert "every_n_epochs" in r["ckpt_steps"]
        assert r["monitor"].startswith("ConfigError: hybrid_monitor='val_loss' is invalid") and "val_acc" in r["monitor"]
        for key in ("sync_log", "sync_log_end", "sync_log_start"):  # training_step, on_train_batch_end/start
            assert r[key].startswith("ConfigError: self.log(..., sync_dist=True) inside a training batch"), r[key]
            assert "sync_dist=False" in r[key]
        assert r["timer"].startswith("ConfigError: max_time=60 s (Timer(interval='step'))") and "'epoch'" in r["timer"]
        assert r["ckpt_zero_time"].startswith("ConfigError: ModelCheckpoint(train_time_interval="), r["ckpt_zero_time"]
    for a, b in zip(out[0]["stopped"], out[1]["stopped"], strict=True):
        assert torch.equal(a, b)  # a run stopped mid-period joins before validating: one model, no hang


def test_slurm_auto_requeue_is_refused_in_hybrid_mode():
    from types import SimpleNamespace

    from lightning.fabric.plugins.environments import SLURMEnvironment

    from hetero_strategy.config import ConfigError
    from hetero_strategy.lightning.hybrid import check_hybrid_trainer

    trainer = SimpleNamespace(val_check_interval=1.0, check_val_every_n_epoch=1, _val_check_time_interval=None,
                              callbacks=[], strategy=SimpleNamespace(cluster_environment=SLURMEnvironment()),
                              lightning_module=SimpleNamespace(automatic_optimization=True))
    with pytest.raises(ConfigError, match=r"SLURMEnvironment\(auto_requeue=True\) is invalid with mode='hybrid'"):
        check_hybrid_trainer(trainer)
    trainer.strategy.cluster_environment = SLURMEnvironment(auto_requeue=False)
    check_hybrid_trainer(trainer)  # the fix the message names


# ---- fp16 mixed precision: the local clipping sees unscaled gradients ---------------------------
CLIP = 0.01


class _GradNorms(Regressor):
    def __init__(self):
        super().__init__(lr=0.01)
        self.norms: list[float] = []

    def on_before_optimizer_step(self, optimizer):  # after hetero's local clipping, before the step
        norms = torch.stack([p.grad.norm() for p in self.parameters() if p.grad is not None])
        self.norms.append(float(norms.norm()))


def _fp16(rank: int, world: int) -> dict:
    import lightning as L
    from lightning.pytorch.plugins.precision import MixedPrecision

    from hetero_strategy import HeteroStrategy

    # NOTE: Trainer(precision="16-mixed") becomes bf16-mixed on CPU; Lightning's fp16 plugin itself runs
    # there (fp16 autocast, a CPU GradScaler), so it is handed in directly
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=10**6)
    strategy = HeteroStrategy(mode="hybrid", periods=[4, 1], plateau_thresholds=[0.05], local_clip_norm=CLIP,
                              batch_sizes=[4, 4],
                              precision_plugin=MixedPrecision("16-mixed", "cpu", scaler))
    model = _GradNorms()
    L.Trainer(strategy=strategy, max_epochs=1, **trainer_kwargs()).fit(model, loader(make_data(32), 4))
    return {"norms": model.norms, "scale": scaler.get_scale()}


def test_fp16_local_clipping_acts_on_unscaled_gradients():
    out = run_distributed(_fp16, 2, timeout=60)
    for r in out:
        assert r["scale"] == 2.0**10  # no step skipped for overflow: every norm is a real step's
        assert len(r["norms"]) == 4
        # clip_grad_norm_: a larger gradient ends at max_norm (clipped while scaled, it would end at CLIP / 1024)
        assert r["norms"] == pytest.approx([CLIP] * 4, rel=1e-3)


class _FusedSGD(_GradNorms):
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, fused=True)  # unscales inside its own step


def _fused(rank: int, world: int, clip: float | None) -> dict:
    import lightning as L
    from lightning.pytorch.plugins.precision import MixedPrecision

    from hetero_strategy import HeteroStrategy
    from hetero_strategy.config import ConfigError

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=10**6)
    strategy = HeteroStrategy(mode="hybrid", periods=[4, 1], plateau_thresholds=[0.05], local_clip_norm=clip,
                              batch_sizes=[4, 4], precision_plugin=MixedPrecision("16-mixed", "cpu", scaler))
    model = _FusedSGD()
    try:
        L.Trainer(strategy=strategy, max_epochs=1, **trainer_kwargs()).fit(model, loader(make_data(32), 4))
    except ConfigError as e:
        return {"error": str(e), "steps": len(model.norms)}
    return {"error": None, "steps": len(model.norms)}


def test_local_clipping_beside_a_fused_fp16_optimizer_is_refused_before_any_step():
    for r in run_distributed(_fused, 2, CLIP, timeout=60):
        assert r["steps"] == 0 and r["error"].startswith("local_clip_norm=0.01 is invalid with SGD(fused=True)")
    # the fix the message names: no local clipping, and the fused optimizer trains
    assert [r["steps"] for r in run_distributed(_fused, 2, None, timeout=60)] == [4, 4]


def test_bad_hybrid_monitor_is_refused_at_construction():
    from hetero_strategy import HeteroStrategy
    from hetero_strategy.config import ConfigError

    for bad in ("", 3, None):
        with pytest.raises(ConfigError, match=r"hybrid_monitor=.* is invalid: give the key"):
            HeteroStrategy(mode="hybrid", hybrid_monitor=bad)


# ---- checkpoints at epoch and validation ends resume exactly, each rank with its own optimizer state --
VAL_LOSS = [1.0, 0.99, 0.98]  # the same on both ranks: a 1% change at epoch 1's validation, below 5%: the switch


class _Lockstep(_Momentum):
    """A barrier after every batch: the same sync points in every run (the timing of the store
    protocol is otherwise free), so a resumed run can be compared bit for bit. Validation logs
    VAL_LOSS, so the phase switches (and the momenta are averaged) at epoch 1's validation end."""

    def __init__(self):
        super().__init__()
        self.momentum_r: list[torch.Tensor] = []

    def on_train_batch_end(self, outputs, batch, batch_idx):
        torch.distributed.barrier()

    def on_train_epoch_end(self):
        state = self.trainer.optimizers[0].state
        self.momentum_r.append(torch.cat([state[p]["momentum_buffer"].flatten() for p in self.parameters()]))

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", VAL_LOSS[self.current_epoch])


def _ckpt(rank: int, world: int, directory: str, state_dict_type: str) -> dict:
    import os

    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from hetero_strategy import HeteroStrategy

    def fit(epochs: int, ckpt_path: str | None = None, save: bool = False) -> tuple:
        strategy = HeteroStrategy(mode="hybrid", periods=[4, 1], plateau_thresholds=[0.05], plateau_evals=1,
                                  batch_sizes=[3, 5], state_dict_type=state_dict_type)
        # NOTE: saved in on_validation_end (as with check_val_every_n_epoch > 1 or a validation-driven
        # save), where the phase switches: the checkpoint must already hold that evaluation
        callbacks = [ModelCheckpoint(dirpath=directory, every_n_epochs=1, save_top_k=-1,
                                     save_on_train_epoch_end=False)] if save else []
        model = _Lockstep()
        trainer = L.Trainer(strategy=strategy, max_epochs=epochs, callbacks=callbacks,
                            **trainer_kwargs(enable_checkpointing=save))
        trainer.fit(model, loader(make_data(64), 4), loader(make_data(8, seed=2), 4), ckpt_path=ckpt_path)
        momentum = [trainer.optimizers[0].state[p]["momentum_buffer"].clone() for p in model.parameters()]
        hybrid = strategy.runtime.hybrid
        return {"weights": [p.detach().clone() for p in model.net.parameters()], "momentum": momentum,
                "points": strategy.runtime.checkpoint_step(), "phase": hybrid.schedule.phase,
                "switches": hybrid.schedule.switches, "momentum_r": model.momentum_r}

    full = fit(3, save=True)
    resumed = {epoch: fit(3, ckpt_path=os.path.join(directory, name))  # a local phase, the switch
               for epoch, name in ((0, "epoch=0-step=8.ckpt"), (1, "epoch=1-step=16.ckpt"))}
    return {"full": full, "resumed": resumed}


@pytest.mark.parametrize("state_dict_type", ["full", "sharded"])
def test_checkpoints_resume_to_the_uninterrupted_run_in_a_local_phase_and_at_the_switch(tmp_path, state_dict_type):
    out = run_distributed(_ckpt, 2, str(tmp_path), state_dict_type, timeout=120)
    # local phases keep the momentum per rank (a resume giving rank 1 rank 0's would show below);
    # the switch at epoch 1's validation averages it
    full = [out[rank]["full"] for rank in range(2)]
    assert not torch.equal(full[0]["momentum_r"][0], full[1]["momentum_r"][0])
    assert torch.equal(full[0]["momentum_r"][2], full[1]["momentum_r"][2])
    assert full[0]["phase"] == 1 and [round(s["loss"], 6) for s in full[0]["switches"]] == [0.99]
    for rank in range(2):
        want = out[rank]["full"]
        for epoch, got in out[rank]["resumed"].items():
            assert got["points"] == want["points"] and got["phase"] == want["phase"], epoch  # carried over
            for a, b in zip(got["weights"], want["weights"], strict=True):
                assert torch.equal(a, b), (rank, epoch, (a - b).abs().max())
            for a, b in zip(got["momentum"], want["momentum"], strict=True):
                assert torch.equal(a, b), (rank, epoch)


# ---- Lightning's SIGTERM broadcasts and private attributes ----------------------------------------
class _FakeTrainer:
    """What the SIGTERM wiring reads of a Trainer, with Lightning's own _SignalConnector."""

    def __init__(self, local: bool):
        from types import SimpleNamespace

        from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector

        self.local_rank, self.world_size = 0, 2
        hybrid = SimpleNamespace(local=local)
        self.strategy = SimpleNamespace(launcher=None, root_device=torch.device("cpu"),
                                        runtime=SimpleNamespace(hybrid=hybrid))
        self._signal_connector = _SignalConnector(self)
        self.fit_loop = SimpleNamespace(epoch_loop=SimpleNamespace(_broadcast_sigterm_tensor=self._broadcast))
        self.broadcasts = 0

    def _broadcast(self):
        self.broadcasts += 1

    @property
    def received_sigterm(self) -> bool:
        return self._signal_connector.received_sigterm


@pytest.mark.parametrize("local", [True, False])
def test_sigterm_in_a_local_phase_broadcasts_nothing(monkeypatch, local):
    import signal

    import torch.distributed as dist
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from hetero_strategy.lightning.internals import local_sigterm

    sent = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)  # as in a job: Lightning's handler broadcasts
    monkeypatch.setattr(dist, "broadcast", lambda tensor, src: sent.append(int(tensor)))
    trainer = _FakeTrainer(local)
    local_sigterm(trainer)
    # what Lightning registers as the SIGTERM handler (register_signal_handlers reads the attribute)
    trainer._signal_connector._sigterm_notifier_fn(signal.SIGTERM, None)
    assert trainer.received_sigterm
    assert sent == ([] if local else [1])  # the synchronous phase keeps Lightning's broadcast
    check = trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor
    if local:
        with pytest.raises(SIGTERMException):  # this rank stops at its own next batch
            check()
        assert trainer.broadcasts == 0
    else:
        check()
        assert trainer.broadcasts == 1


def test_missing_private_lightning_attributes_fail_loudly_at_setup():
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from hetero_strategy.lightning.internals import require_lightning_internals

    def trainer(**kw):
        return L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, **kw)

    require_lightning_internals(trainer(callbacks=[ModelCheckpoint()]))  # Lightning 2.6 has them all
    renamed = trainer()
    del renamed._val_check_time_interval
    with pytest.raises(RuntimeError, match=r"Trainer\._val_check_time_interval is missing in Lightning .*2\.6"):
        require_lightning_internals(renamed)
    renamed = trainer(callbacks=[ModelCheckpoint(every_n_train_steps=2)])
    del renamed.checkpoint_callback._every_n_train_steps  # after Trainer read its state_key
    with pytest.raises(RuntimeError, match=r"ModelCheckpoint\._every_n_train_steps is missing"):
        require_lightning_internals(renamed)
