"""Hugging Face ``Trainer``: ``HeteroTrainer`` follows one process, resumes bitwise, refuses what it cannot do.

Two CPU gloo ranks with batch sizes 3 and 13 (per_device_train_batch_size 8, G = 16) over one whole
shuffled epoch, with the Trainer's defaults that matter (gradient clipping at 1.0, its data seed 42);
the oracle is the plain one-process loop of tests/oracle.py. Resume: a run killed with SIGKILL after
the step-5 checkpoint (save_steps=1) goes on with ``resume_from_checkpoint`` and must end bitwise
where the uninterrupted run ends, Top-K residuals, momentum and the calibrator's rows included.
"""

from __future__ import annotations

import pytest
import torch
from dist_utils import run_distributed
from oracle import make_data, make_net, one_process_sgd
from torch import nn

N, B, STEPS, SEED = 120, 8, 8, 42  # one epoch at G = 16: seven full steps and a short eighth (8 samples)
TOPK = dict(compression="topk", base_density=0.25, dense_warmup_steps=1, dense_fallback=False)


class Rows(torch.utils.data.Dataset):
    """make_data's samples as the dicts a Trainer collates (features and "labels")."""

    def __init__(self, n: int) -> None:
        self.x, self.y = make_data(n).tensors

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


class Regression(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = make_net()
        self.seen: list[int] = []  # this rank's batch sizes, in order

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.training:
            self.seen.append(len(x))
        out = self.net(x).squeeze(1)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


def _args(out_dir, **kw):
    import os

    from transformers import TrainingArguments

    base = dict(per_device_train_batch_size=B, num_train_epochs=1, learning_rate=0.1, optim="sgd",
                lr_scheduler_type="constant", weight_decay=0.0, use_cpu=True,
                ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None,  # in-process: one rank
                report_to="none", disable_tqdm=True, save_strategy="no", logging_steps=2, seed=SEED)
    return TrainingArguments(output_dir=str(out_dir), **{**base, **kw})


def _trainer(out_dir, hetero, callbacks=(), n=N, **kw):
    from hetero_strategy.transformers import HeteroTrainer

    return HeteroTrainer(model=Regression(), args=_args(out_dir, **kw), train_dataset=Rows(n),
                         hetero=hetero, callbacks=list(callbacks))


def _result(trainer):
    model = trainer.model
    return {"weights": [p.detach().clone() for p in model.net.parameters()], "seen": list(model.seen),
            "step": trainer.state.global_step, "history": trainer.state.log_history,
            "optim": trainer.optimizer.state_dict(), "hetero": trainer.hetero.runtime.state_dict()}


def _exact(rank, world_size, out_dir):
    trainer = _trainer(out_dir, {"batch_sizes": [3, 13]})
    trainer.train()
    out = _result(trainer)
    accumulated = _trainer(out_dir, {"batch_sizes": [3, 13]}, n=128, gradient_accumulation_steps=2)
    accumulated.train()
    out["accumulated"] = _result(accumulated)
    try:  # FSDP through TrainingArguments: only a distributed run gets as far as the Accelerator
        _trainer(out_dir, {"batch_sizes": [3, 13]}, fsdp=True)
        out["fsdp_error"] = None
    except Exception as e:  # noqa: BLE001 - the test names what it wants
        out["fsdp_error"] = f"{type(e).__name__}: {e}"
    return out


@pytest.fixture(scope="module")
def exact(tmp_path_factory):
    return run_distributed(_exact, 2, str(tmp_path_factory.mktemp("hf")), timeout=300)


def _errors(runs, oracle):
    return [(got - want.detach()).abs().max().item() for run in runs
            for got, want in zip(run["weights"], oracle.parameters(), strict=True)]


def test_a_whole_epoch_equals_one_process(exact):
    oracle = one_process_sgd(make_data(N), 2 * B, STEPS, shuffle=True, seed=SEED, clip=1.0)
    errors = _errors(exact, oracle)
    print(f"HF Trainer 3/13 vs one process after {STEPS} steps: max abs error {max(errors):.3g}")  # for the notes
    assert exact[0]["step"] == STEPS and max(errors) <= 1e-5, errors
    for a, b in zip(exact[0]["weights"], exact[1]["weights"], strict=True):
        assert torch.equal(a, b)  # ranks identical


def test_gradient_accumulation_steps_keep_one_process_sgd(exact):
    # 128 samples: 8 full batches of G = 16, two per optimizer step (a short batch in a window is
    # weighted otherwise than the Trainer's 1/accumulation, and hetero warns about it)
    oracle = one_process_sgd(make_data(128), 2 * B, STEPS // 2, shuffle=True, seed=SEED, clip=1.0, accumulate=2)
    runs = [r["accumulated"] for r in exact]
    assert runs[0]["step"] == STEPS // 2
    assert max(_errors(runs, oracle)) <= 1e-5


def test_each_rank_takes_its_share_and_the_metrics_reach_the_log_history(exact):
    assert exact[0]["seen"][:7] == [3] * 7 and exact[1]["seen"][:7] == [13] * 7
    assert exact[0]["seen"][7] + exact[1]["seen"][7] == N - 7 * 2 * B  # the short last batch
    logged = [h for h in exact[0]["history"] if "loss" in h]
    assert len(logged) == STEPS // 2  # logging_steps=2
    assert all(h["hetero/batch_size_r0"] == 3 and h["hetero/batch_size_r1"] == 13 for h in logged[:-1])
    assert all(0 <= h["hetero/balance"] <= 1 for h in logged)


def _resume(rank, world_size, out_dir, phase):
    from transformers import TrainerCallback

    class KillAfterSave(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == 5:
                import os
                import signal

                torch.distributed.barrier()  # both ranks wrote their part of checkpoint-5
                os.kill(os.getpid(), signal.SIGKILL)

    hetero = {"batch_sizes": [3, 13], "calibrate": True, "cold_start_steps": 2, **TOPK}
    kw = dict(optim_args="momentum=0.9", save_strategy="steps", save_steps=1)
    if phase == "whole":
        trainer = _trainer(f"{out_dir}/whole", hetero, **kw)
        trainer.train()
    elif phase == "killed":
        _trainer(f"{out_dir}/run", hetero, callbacks=[KillAfterSave()], **kw).train()
        raise AssertionError("the run was to be killed after step 5")
    else:
        trainer = _trainer(f"{out_dir}/run", hetero, **kw)
        trainer.train(resume_from_checkpoint=True)  # the last checkpoint in output_dir: checkpoint-5
    return _result(trainer)


def test_killed_after_step_5_and_resumed_ends_bitwise_equal(tmp_path):
    whole = run_distributed(_resume, 2, str(tmp_path), "whole", timeout=300)
    killed = run_distributed(_resume, 2, str(tmp_path), "killed", timeout=300, may_die=(0, 1))
    assert killed == [None, None] and (tmp_path / "run" / "checkpoint-5" / "hetero_state.pt").is_file()
    assert not (tmp_path / "run" / "checkpoint-6").exists()
    resumed = run_distributed(_resume, 2, str(tmp_path), "resumed", timeout=300)
    for rank in range(2):
        assert resumed[rank]["step"] == whole[rank]["step"] == STEPS
        assert resumed[rank]["seen"] == whole[rank]["seen"][5:]  # the sampler went on from step 5
        for a, b in zip(resumed[rank]["weights"], whole[rank]["weights"], strict=True):
            assert torch.equal(a, b)
        for key, momentum in whole[rank]["optim"]["state"].items():
            assert torch.equal(resumed[rank]["optim"]["state"][key]["momentum_buffer"], momentum["momentum_buffer"])
        want, got = whole[rank]["hetero"]["hook"], resumed[rank]["hetero"]["hook"]
        assert got["step"] == want["step"] and want["residuals"]
        for key, residual in want["residuals"].items():
            assert torch.equal(got["residuals"][key], residual)
        rows = [[row[0] for row in r["hetero"]["balancer"]["pending"]] for r in (whole[rank], resumed[rank])]
        assert rows[0] == list(range(2, STEPS)) and rows[1] == rows[0]


def test_fsdp_through_training_arguments_is_refused_with_the_field(exact):
    for rank in range(2):
        assert exact[rank]["fsdp_error"].startswith("ConfigError: TrainingArguments(fsdp=...) is invalid"), exact[rank]


@pytest.mark.parametrize(("hetero", "kw", "field"), [
    ({"mode": "hybrid"}, {}, "mode='hybrid'"),
    ({"precision_policy": ["bf16", "fp32"]}, {}, "precision_policy"),
    ({"checkpoint_dir": "ckpt"}, {}, "checkpoint_dir"),
    ({}, {"auto_find_batch_size": True}, "auto_find_batch_size"),
    ({"batch_size": [3]}, {}, "batch_size"),
])
def test_what_it_cannot_honour_is_refused_at_construction(tmp_path, hetero, kw, field):
    from hetero_strategy.config import ConfigError

    with pytest.raises((ConfigError, TypeError), match=field):
        _trainer(tmp_path, hetero, **kw)
