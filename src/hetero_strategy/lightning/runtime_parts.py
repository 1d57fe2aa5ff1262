"""What both Lightning strategies (``hetero``: DDP, ``hetero_fsdp``: FSDP2) do alike around the runtime.

A mixin placed before Lightning's strategy class: the run's :class:`HeteroRuntime` and its parts,
the training loader the runtime splits, the start-up probe of the real ``training_step``, and the
per-step events (batch start, forward inside a stall-bounded phase, step end with the metrics).
Nothing here decides anything: each method forwards a Lightning event to the runtime.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader

from hetero_strategy.balance import HeteroBatchSampler
from hetero_strategy.balance.online import OnlineBalancer
from hetero_strategy.balance.probe import ProbeExchange, StepCost
from hetero_strategy.config import ConfigError, HeteroConfig
from hetero_strategy.lightning.dataloaders import LoaderPlacement
from hetero_strategy.lightning.metrics import log_runtime_metrics
from hetero_strategy.lightning.probe import probe_lightning_module
from hetero_strategy.lightning.quiet import quiet_lightning
from hetero_strategy.lightning.runs import Owner, carried_runtime
from hetero_strategy.runtime import HeteroRuntime, StepTimer

__all__ = ["RuntimeParts"]


class RuntimeParts:
    """The runtime of a Lightning run and the events both hetero strategies forward to it."""

    hetero_config: HeteroConfig
    _runtime: HeteroRuntime | None
    _owner: Owner | None
    _loaders: LoaderPlacement

    _early_pass = False  # inside the backward of a pass before the last (micro-batching)
    _keep_grads = False  # the earlier passes' gradients wait in .grad: skip Lightning's next zero_grad
    _batch_idx = 0  # of the batch in training (on_train_batch_start)

    def _guard_zero_grad(self) -> None:
        """Once the optimizers exist: their zero_grad skips once when the earlier passes' gradients wait
        (installed always: the probe's memory caps, planned later, can make passes too)."""
        for optimizer in self.optimizers:
            real = optimizer.zero_grad

            def zero_grad(*args: Any, _real: Any = real, **kwargs: Any) -> None:
                if self._keep_grads:
                    self._keep_grads = False
                    return
                _real(*args, **kwargs)

            optimizer.zero_grad = zero_grad

    def _init_parts(self) -> None:
        quiet_lightning()  # before the Trainer is built: it logs one of the messages (quiet.py)
        self._runtime = None
        self._owner = None  # (trainer, module) of the last run
        self._loaders = LoaderPlacement()  # who places the samplers, per stage

    # ---- the framework-free core (see hetero_strategy.runtime) ----------------------------
    @property
    def runtime(self) -> HeteroRuntime:
        if self._runtime is None:
            raise RuntimeError(f"{type(self).__name__}.runtime exists once the strategy's environment is set up")
        return self._runtime

    @property
    def hook_state(self) -> Any:
        return None if self._runtime is None else self._runtime.hook_state

    @property
    def sampler(self) -> HeteroBatchSampler | None:
        return None if self._runtime is None else self._runtime.sampler

    @property
    def balancer(self) -> OnlineBalancer | None:
        return None if self._runtime is None else self._runtime.balancer

    @property
    def timer(self) -> StepTimer | None:
        return None if self._runtime is None else self._runtime.timer

    def _start_runtime(self) -> HeteroRuntime:
        """This run's runtime; a Trainer's earlier run of this model (fit, then fit again or test) goes on."""
        previous, self._owner = carried_runtime(self._runtime, self._owner, self.lightning_module)
        self._runtime = HeteroRuntime(self.hetero_config, self.global_rank, self.world_size,
                                      info=rank_zero_info, warn=rank_zero_warn)
        self._runtime.continue_from(previous)  # parts built later (scaler, sampler) take their state then
        return self._runtime

    def _trainer(self) -> Any:
        return self.lightning_module.trainer if self.lightning_module is not None else None

    # ---- data ----------------------------------------------------------------------------
    def process_dataloader(self, dataloader: object) -> object:
        trainer = self._trainer()
        if not isinstance(dataloader, DataLoader) or trainer is None:
            return dataloader
        return self._loaders.place(dataloader, trainer, self.runtime, measure=self._measure, rank=self.global_rank,
                                   seed=self.hetero_config.balance.seed, world_size=self.world_size)

    def _measure(self, batches: list[tuple[Any, int]], exchange: ProbeExchange) -> StepCost | None:
        """The probe of the real model's training_step, batches moved to this rank's device."""
        on_device = [(self.batch_to_device(b, dataloader_idx=0), n) for b, n in batches]
        with self.runtime.autocast():  # timed in the dtype this rank will train in
            return probe_lightning_module(self.lightning_module, on_device, self.hetero_config.balance.probe_steps,
                                          exchange=exchange)

    # ---- per step ------------------------------------------------------------------------
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)  # type: ignore[misc]
        self._batch_idx = batch_idx
        self.runtime.batch_start(step_in_epoch=batch_idx)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """The user's training_step once per pass of this rank's share (one pass within its memory cap).

        Every pass but the last runs forward and backward here, without gradient sync, its loss
        weighted n_i / b_r; the last pass's weighted loss goes back to Lightning, which
        backpropagates it (and syncs), plus the earlier passes' detached, so the logged loss is the
        share's mean."""
        passes = list(self.runtime.micro_batches(args[0], self.model)) if args else []
        if len(passes) <= 1:
            return self._forward(*args, **kwargs)
        if not self.lightning_module.automatic_optimization:
            raise ConfigError(f"max_batch_sizes={self.hetero_config.balance.max_batch_sizes} is invalid with manual "
                              "optimization: a share above its cap runs as passes that hetero backpropagates; "
                              "raise the cap to the share, or use automatic optimization")
        accumulate = getattr(self._trainer(), "accumulate_grad_batches", 1)
        if self._batch_idx % accumulate == 0:  # NOTE: Lightning passes batch_idx only if training_step takes it
            # NOTE: Lightning zeroes the gradients between training_step and backward, which would
            # drop the earlier passes' gradients: they are zeroed here instead, and that zero_grad skipped
            for optimizer in self.optimizers:
                optimizer.zero_grad()
            self._keep_grads = True
        earlier = None
        for micro, context in passes[:-1]:
            with context:
                loss = _loss_of(self._forward(micro.batch, *args[1:], **kwargs))
                if loss is not None:  # None: the user skipped this pass
                    self._early_pass = True
                    try:
                        self.backward(loss * (micro.weight / accumulate), None)
                    finally:
                        self._early_pass = False
                    earlier = loss.detach() * micro.weight + (0 if earlier is None else earlier)
        micro = passes[-1][0]
        out = self._forward(micro.batch, *args[1:], **kwargs)
        loss = _loss_of(out)
        return out if loss is None else _with_loss(out, loss * micro.weight + (0 if earlier is None else earlier))

    def _forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.runtime.phase("forward"):  # the forward may gather parameters or sync buffers: collectives
            return super().training_step(*args, **kwargs)  # type: ignore[misc]

    def post_backward(self, closure_loss: Any) -> None:
        super().post_backward(closure_loss)  # type: ignore[misc]
        if not self._early_pass:  # the step's compute ends with its last pass's backward
            self.runtime.backward_end()

    def _step_end(self) -> Any:
        """After the optimizer step: the runtime's timings and calibration, then its metrics when due."""
        trainer = self._trainer()
        self.runtime.step_end(trainer.global_step if trainer is not None else None)
        log_runtime_metrics(self.lightning_module, trainer, self.runtime)
        return trainer

    def hetero_state_dict(self) -> dict:
        """This rank's hetero state: sampler schedule, hook state (e.g. residuals), calibrator."""
        return self.runtime.state_dict()


def _loss_of(out: Any) -> Any:
    return out.get("loss") if isinstance(out, dict) else out


def _with_loss(out: Any, loss: Any) -> Any:
    return {**out, "loss": loss} if isinstance(out, dict) else loss
