"""``HeteroTrainer``: the Hugging Face ``Trainer`` with capacity-sized per-rank batches.

A thin adapter over :class:`hetero_strategy.accelerate.HeteroPlugin` (and through it the runtime):
the Trainer builds its own Accelerator, loader and optimizer, so the plugin's parts are called at
the Trainer's own points (``get_train_dataloader``, ``_prepare_for_training``, ``training_step``,
``_save_checkpoint``, ``log``) instead of through ``plugin.prepare``. It decides nothing itself.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from hetero_strategy.accelerate.checks import check_accelerator
from hetero_strategy.accelerate.plugin import HeteroPlugin
from hetero_strategy.config import ConfigError, HeteroConfig

__all__ = ["HeteroTrainer"]

STATE_FILE = "hetero_state.pt"  # beside the Trainer's own files in each checkpoint-N folder


class HeteroTrainer(Trainer):
    """``transformers.Trainer`` whose ranks each take a capacity-sized slice of the global batch.

    ``per_device_train_batch_size`` B is the *mean* per-rank batch: the global batch is
    G = B x world size, as under the plain Trainer, split by measured capacity (or ``batch_sizes``),
    and every optimizer step equals one process's step on G (also with
    ``gradient_accumulation_steps``). The loss must be a per-batch mean (the model's default):
    ranks are weighted by samples, so the Trainer's token count (``num_items_in_batch``) is not used.
    Every other argument is the ``Trainer``'s.

    Args:
        hetero: the plugin's settings: a dict of :class:`HeteroPlugin` keywords
            (``{"batch_sizes": [3, 13]}``), a :class:`HeteroConfig`, or a YAML path; None reads
            ``$HETERO_STRATEGY_CONFIG``, else defaults.
    """

    def __init__(self, *args: Any, hetero: dict[str, Any] | HeteroConfig | str | Path | None = None,
                 **kwargs: Any) -> None:
        if isinstance(hetero, dict):
            self.hetero = HeteroPlugin(**hetero)
        elif hetero is None or isinstance(hetero, (HeteroConfig, str, Path)):
            self.hetero = HeteroPlugin(hetero)
        else:
            raise ConfigError(f"hetero={hetero!r} is invalid: pass a dict of HeteroPlugin keywords, a HeteroConfig "
                              "or the path of a hetero YAML")
        _check_config(self.hetero.config)
        super().__init__(*args, **kwargs)
        _check_args(self.args)
        self.loss_is_scaled_for_ga = False  # a per-batch mean: the Trainer divides it by the accumulation

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        for flag, field in (("is_deepspeed_enabled", "deepspeed"), ("is_fsdp_enabled", "fsdp")):
            # NOTE: the arguments too: a process's first Accelerator fixes the distributed type for later ones
            if getattr(self, flag, False) or getattr(self.args, field, None) not in (None, False, "", []):
                raise ConfigError(f"TrainingArguments({field}=...) is invalid with HeteroTrainer: it reduces "
                                  "gradients itself, while hetero weights each rank's share in a DDP comm hook. "
                                  f"Drop {field} (plain DDP), or use HeteroPlugin with FSDP2 in an Accelerate loop")
        check_accelerator(self.accelerator)  # split_batches, dispatch_batches ... at construction

    # ---- the loader: planned by the runtime, dealt out by Accelerate -----------------------------
    def get_train_dataloader(self) -> Any:
        plain = super().get_train_dataloader  # built unprepared below: the plan replaces its sampler
        accelerator = self.accelerator
        prepare = accelerator.prepare
        accelerator.prepare = lambda loader: loader  # NOTE: the Trainer's loader, unprepared (planned next)
        try:
            loader = plain()
        finally:
            accelerator.prepare = prepare
        plugin = self.hetero
        if plugin.runtime is None:
            plugin.begin(accelerator)
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed  # the Trainer's shuffle
        return plugin.plan_loader(loader, self.model, accumulate=self.args.gradient_accumulation_steps,
                                  seed=seed).loader

    def get_resumed_dataloader(self, dataloader: Any, num_batches: int) -> Any:
        return dataloader  # the hetero sampler resumes at its saved position itself (hetero_state.pt)

    def _get_num_items_in_batch(self, batch_samples: list, device: Any) -> None:
        return None  # ranks are weighted by samples: each loss is its own batch's mean

    def _prepare_for_training(self, max_steps: int, train_dataloader: Any, resume_from_checkpoint: Any) -> Any:
        model, loader = super()._prepare_for_training(max_steps, train_dataloader, resume_from_checkpoint)
        self.hetero.attach([model, self.optimizer], max_steps=max_steps)
        if resume_from_checkpoint is not None:
            path = Path(resume_from_checkpoint) / STATE_FILE
            if not path.is_file():
                raise ConfigError(f"resume_from_checkpoint={str(resume_from_checkpoint)!r} is invalid: it has no "
                                  f"{STATE_FILE} (not written by HeteroTrainer); resume from a HeteroTrainer "
                                  "checkpoint, or start afresh")
            self.hetero.load_state_dict(torch.load(path, map_location="cpu", weights_only=False))
        return model, loader

    # ---- per step ----------------------------------------------------------------------------
    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
        runtime = self.hetero.runtime
        runtime.batch_start()  # the oldest planned batch: its weight b_r / G (the Trainer fetches ahead)
        with runtime.phase("exchange"):  # the comm hook's exchange runs inside the backward
            loss = super().training_step(model, inputs, None)
        self.hetero.backward_done()
        return loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        # NOTE: the Trainer calls log on every rank at the same steps: the metrics' all-gather is safe
        if "loss" in logs and self.hetero.runtime is not None and self.hetero.runtime.sampler is not None:
            logs = {**logs, **self.hetero.metrics()}
        super().log(logs, start_time)

    # ---- checkpoints -------------------------------------------------------------------------
    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        # NOTE: written first, so a folder the Trainer finished (trainer_state.json) always holds it
        state = self.hetero.state_dict()  # collective: every rank is here
        folder = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self.args.should_save:
            folder.mkdir(parents=True, exist_ok=True)
            torch.save(state, folder / STATE_FILE)
        super()._save_checkpoint(model, trial)


def _check_config(config: HeteroConfig) -> None:
    if config.hybrid.mode != "sync":
        raise ConfigError(f"mode={config.hybrid.mode!r} is invalid with HeteroTrainer: the Trainer's loop has no "
                          "local-SGD phases; use mode='sync', or HeteroPlugin in an Accelerate loop")
    if config.precision.precision_policy is not None:
        raise ConfigError(f"precision_policy={config.precision.precision_policy!r} is invalid with HeteroTrainer: "
                          "the Trainer scales the loss itself; use TrainingArguments(bf16=True / fp16=True) for "
                          "every rank, or HeteroPlugin in an Accelerate loop")
    if config.reliability.checkpoint_dir is not None:
        raise ConfigError(f"checkpoint_dir={config.reliability.checkpoint_dir!r} is invalid with HeteroTrainer: "
                          "its checkpoints are the Trainer's; use TrainingArguments(output_dir=..., save_steps=...)"
                          " and trainer.train(resume_from_checkpoint=...)")


def _check_args(args: Any) -> None:
    if args.auto_find_batch_size:
        raise ConfigError("TrainingArguments(auto_find_batch_size=True) is invalid with HeteroTrainer: hetero plans "
                          "each rank's batch from its capacity and memory; set max_batch_sizes in hetero= instead")
    if getattr(args, "n_gpu", 0) > 1:
        raise ConfigError(f"n_gpu={args.n_gpu} is invalid with HeteroTrainer: one process drives several GPUs "
                          "(DataParallel); launch one process per GPU (torchrun / accelerate launch)")
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        raise ConfigError("ACCELERATE_USE_DEEPSPEED=true is invalid with HeteroTrainer; launch with DDP")
