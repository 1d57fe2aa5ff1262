"""``HeteroPlugin``: hetero's batch sizing, comm hooks and calibration for Hugging Face Accelerate.

A thin adapter over :class:`hetero_strategy.runtime.HeteroRuntime`: it wires Accelerate's
objects (the prepared model, loader, optimizer, scheduler, ``save_state``, trackers) to the
runtime and decides nothing itself.

The training loop, with gradient accumulation, hybrid phases and micro-batches: docs/accelerate.md.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from hetero_strategy.accelerate.checks import check_accelerator, check_precision, second_hook_error
from hetero_strategy.accelerate.loader import HeteroDataLoader, LossFn, train_loader
from hetero_strategy.accelerate.wiring import (
    SaveStateHook,
    checkpointed_extras,
    in_phase,
    state_init_step,
    wire_steps,
)
from hetero_strategy.config import ConfigError, HeteroConfig
from hetero_strategy.runtime import HeteroRuntime
from hetero_strategy.runtime.checkpoint import Checkpointer, Resumed
from hetero_strategy.runtime.fsdp import check_sharded_config, fsdp_modules
from hetero_strategy.runtime.loaders import train_loader_batch_size

__all__ = ["HeteroPlugin"]


class HeteroPlugin:
    """Capacity-sized per-rank batches with one-process SGD semantics, for an Accelerate script.

    The training DataLoader's ``batch_size`` B is the *mean* per-rank batch: the global batch
    G = B x num_processes is what plain Accelerate DDP would use, split across ranks by capacity,
    and the reduced gradient is sum_r b_r g_r / G.

    Args:
        config: a :class:`HeteroConfig` or the path of a YAML file; None reads the path in
            ``$HETERO_STRATEGY_CONFIG`` (as written by ``hetero-strategy config``), else defaults.
        log_every_n_steps: optimizer steps between two rounds of per-rank metrics sent to
            ``accelerator.log`` (when the Accelerator has trackers).
        **fields: any field of :class:`HeteroConfig` (``batch_sizes``, ``compression``,
            ``calibrate`` ...), applied on top of ``config``.
    """

    def __init__(self, config: str | Path | HeteroConfig | None = None, *, log_every_n_steps: int = 50,
                 **fields: Any) -> None:
        self.config, self.config_source = HeteroConfig.from_env(config, fields), HeteroConfig.source(config, fields)
        if isinstance(log_every_n_steps, bool) or not isinstance(log_every_n_steps, int) or log_every_n_steps < 1:
            raise ConfigError(f"log_every_n_steps={log_every_n_steps!r} is invalid: must be an integer >= 1")
        self.log_every_n_steps = log_every_n_steps
        self.runtime: HeteroRuntime | None = None
        self.accelerator: Any = None
        self.last_metrics: dict[str, float] = {}
        self._optimizers: list[Any] = []
        self.checkpoints: Checkpointer | None = None
        self.resumed: Resumed | None = None  # where prepare() resumed from (checkpoint_dir, resume="auto")
        self._save_due = False
        self._model: Any = None
        self._pass: tuple[float, bool] | None = None  # inside micro_batches: (loss weight, last pass)
        self._warned_cap = False
        self._state: SaveStateHook | None = None  # hetero's part of a checkpoint (attach)

    # ---- prepare -------------------------------------------------------------------------
    def prepare(self, accelerator: Any, *objects: Any, loss_fn: LossFn | None = None,
                max_steps: int | None = None) -> Any:
        """``accelerator.prepare(*objects)``, then hetero's wiring; returns the objects in order.

        The first DataLoader is the training loader: it is rebuilt so each rank gets its
        capacity-sized slice of the one-process global batch (any other loader is prepared as
        Accelerate does). ``loss_fn(model, batch)`` is what the start-up probe times when neither
        batch sizes nor capacities are configured (default: :func:`default_loss`). ``max_steps``
        is the run's length in optimizer steps, the period of the compression density schedule.
        """
        train_index = next((i for i, o in enumerate(objects) if isinstance(o, DataLoader)), None)
        if train_index is None:
            kinds = ", ".join(type(o).__name__ for o in objects) or "nothing"
            raise ConfigError(f"objects=({kinds}) is invalid for HeteroPlugin.prepare: pass the training "
                              "DataLoader (map-style dataset, batch_size=B) together with the model and optimizer")
        train_loader_batch_size(objects[train_index])  # refuse loaders hetero cannot split, before any work
        self.begin(accelerator, [o for o in objects if isinstance(o, torch.optim.Optimizer)])
        rest = [o for i, o in enumerate(objects) if i != train_index]
        prepared = _as_list(accelerator.prepare(*rest)) if rest else []
        self.attach(prepared, max_steps=max_steps)
        loader = self.plan_loader(objects[train_index], self._model, loss_fn)
        if self.config.reliability.checkpoint_dir is not None:
            self._resume(prepared, loader)
        prepared.insert(train_index, loader)
        return prepared[0] if len(prepared) == 1 else tuple(prepared)

    # ---- the parts of prepare, for a framework that prepares its objects itself (HF Trainer) ----
    def begin(self, accelerator: Any, optimizers: list[Any] = ()) -> HeteroRuntime:
        """Check the Accelerator and start this plugin's runtime (before anything is prepared)."""
        check_accelerator(accelerator)
        if getattr(accelerator, "is_fsdp2", False):
            check_sharded_config(self.config)  # what FSDP2 cannot do under hetero, before any work
        check_precision(accelerator, self.config.precision.precision_policy)
        if self.runtime is not None:
            raise RuntimeError("HeteroPlugin.prepare was already called; use one plugin per Accelerator")
        runtime = HeteroRuntime(self.config, accelerator.process_index, accelerator.num_processes,
                                info=accelerator.print, warn=lambda m: warnings.warn(m, stacklevel=3))
        runtime.check_local_clipping(list(optimizers), getattr(accelerator, "scaler", None) is not None)
        runtime.info(f"hetero: settings from {self.config_source}")
        self.accelerator, self.runtime = accelerator, runtime
        return runtime

    def plan_loader(self, loader: DataLoader, model: Any, loss_fn: LossFn | None = None,
                    accumulate: int | None = None, seed: int | None = None) -> HeteroDataLoader:
        """The training loader planned and prepared (probing ``model`` when nothing is configured);
        ``accumulate``: micro-batches per optimizer step (default: the Accelerator's); ``seed``: the
        shuffle's when the config sets none (default 0)."""
        if accumulate is None:
            accumulate = self.accelerator.gradient_accumulation_steps
        return train_loader(self.accelerator, self.runtime, loader, model, loss_fn, accumulate, seed)

    def attach(self, prepared: list[Any], *, max_steps: int | None = None) -> Any:
        """Wire the prepared model, optimizers and schedulers to the runtime; returns the model."""
        accelerator = self.accelerator
        model = next((o for o in prepared if isinstance(o, torch.nn.Module)), None)
        # NOTE: with dynamo_backend / torch.compile Accelerate returns DDP inside an OptimizedModule
        ddp = getattr(model, "_orig_mod", model)
        if isinstance(ddp, DistributedDataParallel):
            try:
                self.runtime.register_hook(ddp, max_steps=max_steps)
            except RuntimeError as e:
                raise (second_hook_error(e) or e) from e
            # its buffer sync is a collective; in a local phase the forward runs under no_sync
            ddp.forward = in_phase(self.runtime, "forward", ddp.forward, ddp if self.runtime.hybrid else None)
        elif fsdp_modules(ddp):  # FSDP2: plugin.backward weights the loss (the step refuses a loss it did not)
            self.runtime.register_sharded(fsdp_modules(ddp))
        elif accelerator.num_processes > 1:
            raise ConfigError(f"model={type(model).__name__} is invalid for HeteroPlugin.prepare: with "
                              f"{accelerator.num_processes} processes it needs the DistributedDataParallel model "
                              "Accelerate builds; pass the nn.Module itself to prepare")
        elif self.runtime.hybrid is not None and model is not None:
            # one process (a script tried before launching): local steps on the plain module, no exchange
            self.runtime.hybrid.attach(model)
            model.forward = in_phase(self.runtime, "forward", model.forward, model)
        self.runtime.setup_precision(accelerator.device, None if model is None else accelerator.unwrap_model(model))
        self._optimizers = wire_steps(prepared, self.runtime, self._after_step, self._gates())
        if fsdp_modules(ddp) and self._optimizers:  # the first optimizer checks once per step
            self._optimizers[0].register_step_pre_hook(self._require_weighed)
        self._state = SaveStateHook(self.runtime, self._optimizers)
        accelerator.register_for_checkpointing(self._state)
        if self.runtime.hybrid is not None:  # before save_state writes anything: only where the ranks agree
            accelerator.register_save_state_pre_hook(lambda *_: self.runtime.require_synced("accelerator.save_state"))
        self._model = model
        return model

    def _resume(self, prepared: list[Any], loader: HeteroDataLoader) -> None:
        """Periodic checkpoints of model, optimizers, schedulers and hetero state, and resume="auto"."""
        self.checkpoints = Checkpointer(self.runtime, stateful=checkpointed_extras(self.accelerator, prepared))
        self.resumed = self.checkpoints.resume(self._model, self._optimizers)
        if self.resumed is not None:
            loader.set_epoch(self.resumed.epoch)  # Accelerate's own epoch counter starts there
        loader.before_batch = self._save_if_due

    def _require_weighed(self, optimizer: Any, *_: Any) -> None:
        if not state_init_step(optimizer):
            self.runtime.hook_state.require_weighed("call plugin.backward(loss) in place of accelerator.backward(loss)")

    def _save_if_due(self) -> None:
        # NOTE: saved when the next batch is handed out: the scheduler stepped and the step's
        # gradients are gone, so the checkpoint is the state between two iterations
        if self._save_due:
            self._save_due = False
            self.checkpoints.save(self._model, self._optimizers)

    # ---- per step ------------------------------------------------------------------------
    def autocast(self) -> Any:
        """``with plugin.autocast():`` the forward, in this rank's dtype (precision_policy)."""
        return self.runtime.autocast()

    def micro_batches(self, batch: Any) -> Iterator[Any]:
        """This rank's batch as passes of at most its memory cap (``max_batch_sizes``, else the probe's),
        for a share larger than one pass can hold; one pass when it fits::

            for micro in plugin.micro_batches(batch):
                plugin.backward(model(**micro).loss)

        :meth:`backward` weighs each pass's loss by its n_i / b_r, and only the last pass
        synchronises gradients, so the step stays one process's SGD (docs/fsdp.md, micro-batching)."""
        passes = list(self._need("micro_batches").micro_batches(batch, self._model))
        try:
            for i, (micro, context) in enumerate(passes):
                self._pass = (micro.weight, i == len(passes) - 1)
                with context:  # its forward too: DDP decides in forward whether backward reduces
                    yield micro.batch
        finally:
            self._pass = None

    def backward(self, loss: Any, **kwargs: Any) -> None:
        """``accelerator.backward`` of the loss, weighted by b_r / G under FSDP2 and scaled on fp16 ranks
        (needed with FSDP2, with precision_policy and with :meth:`micro_batches`).

        After the micro-batch that syncs, the overflow decision is taken from the reduced gradient
        right away, so clipping by value before ``optimizer.step()`` cannot hide an inf.
        """
        weight, last = self._pass or (1.0, True)
        cap = None if self._pass is not None or self._warned_cap else self._need("backward").pass_cap
        if cap is not None and self.runtime.local_batch > cap:
            self._warned_cap = True
            self.runtime.warn(f"hetero: rank {self.runtime.rank}'s share {self.runtime.local_batch} exceeds its memory "
                              f"cap {cap} and runs in one pass; iterate `for micro in plugin.micro_batches(batch):`")
        with self.runtime.phase("exchange"):  # the comm hook's exchange runs inside backward
            self.accelerator.backward(self.runtime.scale_loss(loss * weight if weight != 1.0 else loss), **kwargs)
        if last:
            self.backward_done()

    def backward_done(self) -> None:
        """After the backward that synchronised gradients: take the step's overflow decision now (for a
        framework that calls ``accelerator.backward`` itself)."""
        if self._gates() and self.accelerator.sync_gradients:
            self.runtime.check_overflow(p for opt in self._optimizers for g in opt.param_groups for p in g["params"])

    def _gates(self) -> bool:
        """Whether hetero decides if a step goes ahead: not when Accelerate's GradScaler (its fp16
        mixed precision) does, since clearing an overflowed gradient would hide it from the scaler."""
        return self.runtime.precision is not None or getattr(self.accelerator, "scaler", None) is None

    def _after_step(self) -> None:
        self.runtime.step_end()
        if self.checkpoints is not None:
            self._save_due = self.checkpoints.poll() or self._save_due  # two steps without a batch between
        step = self.runtime.steps - 1
        # log_with is the same on every rank (trackers live on the main process only), so every
        # rank joins the metrics' all-gather at the same steps.
        if self.accelerator.log_with and self.runtime.metrics_point(step, self.log_every_n_steps):
            with self.runtime.phase("metrics"):
                self.last_metrics = self.runtime.metrics()
            self.accelerator.log(self.last_metrics, step=step)

    def join(self) -> None:
        """mode="hybrid": this rank's data is over (collective; the loader calls it at each epoch's end,
        call it after leaving the loop early). Then every rank holds the same model."""
        self._need("join").join()

    def evaluated(self, val_loss: float) -> bool:
        """mode="hybrid": the validation loss on every rank after an epoch (collective: the phase schedule
        takes the mean over ranks). True when the phase changed; a no-op in ``mode="sync"``."""
        self.join()
        return self.runtime.evaluated(val_loss)

    def close(self) -> None:
        """The end of training: stop the stall heartbeat (call before ``accelerator.end_training()``)."""
        if self.runtime is not None:
            self.runtime.join()  # mode="hybrid": a loop that stopped mid-epoch ends on one model
        if self.checkpoints is not None:
            self._save_if_due()  # the last step's checkpoint, when one was due
            self.checkpoints.close()
        if self.runtime is not None:
            self.runtime.close()

    def metrics(self) -> dict[str, float]:
        """The latest per-rank figures (collective: call it on every rank at the same point)."""
        self.last_metrics = self._need("metrics").metrics()
        return self.last_metrics

    def summary(self) -> dict[str, Any]:
        """The run so far: batch split, global samples/s, balance, wire bytes per step (collective)."""
        return self._need("summary").summary()

    def state_dict(self) -> dict[str, Any]:
        """hetero's part of a checkpoint, every rank's (collective; save it from the main process)."""
        self._need("state_dict")
        return self._state.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output on every rank (each takes its own part)."""
        self._need("load_state_dict")
        self._state.load_state_dict(state)

    def _need(self, method: str) -> HeteroRuntime:
        if self.runtime is None or (self._state is None and method.endswith("state_dict")):
            raise RuntimeError(f"HeteroPlugin.{method} needs prepare() first")
        return self.runtime

    @property
    def hook_state(self) -> Any:
        return None if self.runtime is None else self.runtime.hook_state

    @property
    def batch_sizes(self) -> list[int] | None:
        """The split in force (the latest scheduled one under calibration)."""
        sampler = None if self.runtime is None else self.runtime.sampler
        return None if sampler is None else sampler.batch_sizes


def _as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]
