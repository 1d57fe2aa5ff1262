"""FSDP2 under hetero: shard what the user did not, and make the reduce-scatter exact for unequal batches.

FSDP2 (``torch.distributed.fsdp.fully_shard``) averages gradients over the data-parallel ranks
by default: each rank's mean-loss gradient counts 1/W, which is wrong when ranks hold b_r samples
of a global batch G. :class:`ShardedReduction` sets every FSDP module's gradient divide factor to
1 (the reduce-scatter sums) and scales each rank's loss by b_r / G_t before backward, so the
reduced shard is sum_r b_r g_r / G_t: one process's SGD on the global batch (docs/design.md
semantics 3). The weight comes from the same step plan as the DDP hook's.

Plain PyTorch: both adapters (Lightning's ``HeteroFSDPStrategy``, Accelerate's FSDP2 plugin) call it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from torch import nn

from hetero_strategy.config import ConfigError, HeteroConfig
from hetero_strategy.dist.exit_guard import note_backward_context

__all__ = ["ShardedReduction", "check_sharded_config", "fsdp_modules", "shard_model", "wrap_class_names"]

#: precision_policy values that give every rank the same parameter dtype under FSDP2 (see check_sharded_config)
SAME_DTYPE_POLICIES = ("bf16", "fp32")


def fsdp_modules(model: Any) -> list[Any]:
    """Every FSDP2 module in ``model`` (the root included), outermost first; none in a non-module."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)] if isinstance(model, nn.Module) else []


def wrap_class_names(policy: str | type | Iterable[str | type] | None) -> set[str]:
    """``auto_wrap_policy`` as class names: one name or class, a comma-separated string, or a list of them."""
    if policy is None:
        return set()
    items = policy.split(",") if isinstance(policy, str) else [policy] if isinstance(policy, type) else list(policy)
    names = set()
    for item in items:
        if isinstance(item, type):
            names.add(item.__name__)
        elif isinstance(item, str) and item.strip():
            names.add(item.strip())
        else:
            raise ConfigError(f"auto_wrap_policy entry {item!r} is invalid: give module classes or their names, "
                              "e.g. auto_wrap_policy=['TransformerEncoderLayer']")
    return names


def shard_model(model: nn.Module, mesh: Any = None, auto_wrap_policy: Any = None, mp_policy: Any = None,
                reshard_after_forward: bool = True) -> list[Any]:
    """``fully_shard`` every module whose class is named in ``auto_wrap_policy``, then the root, unless
    the user sharded ``model`` already (then it is used as it is). Returns the FSDP modules.

    Like Accelerate's ``transformer_layer_cls_to_wrap``: each named block gathers its parameters
    only for its own forward and backward, and the root holds whatever is left (embeddings, head).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    existing = fsdp_modules(model)
    if existing:
        return existing
    names = wrap_class_names(auto_wrap_policy)
    known = {type(m).__name__ for m in model.modules()}
    missing = sorted(names - known)
    if missing:
        raise ConfigError(f"auto_wrap_policy={sorted(names)!r} is invalid: the model has no module of class "
                          f"{missing}; its classes are {sorted(known)}")
    kwargs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward,
              "mp_policy": mp_policy if mp_policy is not None else MixedPrecisionPolicy()}
    # NOTE: innermost first: fully_shard on a parent leaves the parameters a child already owns to it
    blocks = [m for m in model.modules() if type(m).__name__ in names and m is not model]
    for block in reversed(blocks):
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return fsdp_modules(model)


def check_sharded_config(config: HeteroConfig) -> None:
    """Refuse, at construction, what FSDP2 cannot do under hetero (field, value, the alternative)."""
    if config.compression.method != "none":
        raise ConfigError(f"compression={config.compression.method!r} is invalid under FSDP2: DDP comm hooks do not "
                          "run on FSDP's reduce-scatter; use compression='none' with strategy='hetero_fsdp', or "
                          "strategy='hetero' (DDP) to compress")
    if config.hybrid.mode != "sync":
        raise ConfigError(f"mode={config.hybrid.mode!r} is invalid under FSDP2: local-SGD phases need a whole model "
                          "per rank; use mode='sync' with strategy='hetero_fsdp', or strategy='hetero' for hybrid")
    policy = config.precision.precision_policy
    if policy is not None and policy not in SAME_DTYPE_POLICIES:
        raise ConfigError(f"precision_policy={policy!r} is invalid under FSDP2: the shards of one parameter must "
                          f"share a dtype on every rank; give one of {list(SAME_DTYPE_POLICIES)} for all ranks, or "
                          "a MixedPrecisionPolicy (mp_policy=...), or use strategy='hetero' for per-rank dtypes")


def policy_mp(config: HeteroConfig, mp_policy: Any = None) -> Any:
    """The one MixedPrecisionPolicy of every rank: the user's, else from a same-dtype ``precision_policy``;
    gradients are reduced in fp32 unless the user's policy says otherwise."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if mp_policy is not None:
        return mp_policy
    policy = config.precision.precision_policy
    param_dtype = torch.bfloat16 if policy == "bf16" else None
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)


class ShardedReduction:
    """The FSDP2 reduce-scatter as a sum, and this rank's loss weight b_r / G_t.

    The runtime calls :meth:`set_local_batch` at each batch start (the step plan's weight parts,
    as for the DDP hook); the adapter backpropagates ``reduction.weigh(loss)``.
    """

    def __init__(self, modules: Sequence[Any], world_size: int, micro_batching: bool = False) -> None:
        if not modules:
            raise ValueError("ShardedReduction needs the model's FSDP2 modules: shard the model first (shard_model)")
        for module in modules:
            # NOTE: a factor alone becomes NCCL's PREMUL_SUM(1/factor), which gloo lacks; a forced
            # sum with factor 1 is a plain SUM reduce-scatter on every backend, and no division after
            module.set_force_sum_reduction_for_comms(True)
            module.set_gradient_divide_factor(1.0)
        self.modules = list(modules)
        if micro_batching:
            self.keep_gathered()
        self.weight = 1.0 / world_size  # plain averaging until a plan says otherwise
        self.weighed = False  # whether this step's loss went through weigh (refused otherwise)

    def set_local_batch(self, local: float, total: float) -> None:
        if total <= 0 or not 0 <= local <= total:
            raise ValueError(f"local={local}, total={total} are invalid: need 0 <= local <= total and total > 0")
        self.weight = local / total

    def keep_gathered(self) -> None:
        """Micro-batching (runtime/micro.py): ranks may run different numbers of passes, and each
        all-gather is a collective, so the parameters stay gathered from a step's first forward to
        its last backward: every rank all-gathers each unit once and reduce-scatters it once."""
        for module in self.modules:
            module.set_reshard_after_forward(False, recurse=False)

    def probe(self, measure: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        """The start-up probe on this rank's own compute. FSDP2's collectives inside forward and backward
        would make every rank wait for the slowest and time alike; so the parameters are gathered
        once before (one all-gather per unit, every rank alike), the timed steps run no collective
        (no reduce-scatter, no resharding), and afterwards the parameters are resharded. The probe
        clears the gradients it made while the unsharded parameters are the module's own. No dense all-reduce is timed beside (as it is for DDP's exchange):
        FSDP2's exchange is its own."""

        def run(batches: Any, exchange: Any) -> Any:
            # the root settles its own resharding now (at its first forward it would, inside the probe)
            self.modules[0]._get_fsdp_state()._lazy_init()
            after_forward = [_reshards_after_forward(module) for module in self.modules]
            for module in self.modules:
                module.set_requires_gradient_sync(False, recurse=False)
                module.set_reshard_after_backward(False, recurse=False)
                # NOTE: else each unit reshards after its forward and all-gathers again in backward
                module.set_reshard_after_forward(False, recurse=False)
            for module in self.modules:
                module.unshard()
            try:
                return measure(batches, replace(exchange, dense=False))
            finally:
                for module, mesh_info in zip(self.modules, after_forward):
                    module.set_requires_gradient_sync(True, recurse=False)
                    module.set_reshard_after_backward(True, recurse=False)
                    _set_reshards_after_forward(module, mesh_info)
                    _drop_accumulated_grads(module)
                    module.reshard()

        return run

    def state_dict(self) -> dict:  # the weight is set again at every batch start: nothing to keep
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def weigh(self, loss: Any) -> Any:
        """This rank's mean loss times b_r / G_t: the summed reduce-scatter then gives one process's gradient."""
        self.weighed = True
        weighed = loss * self.weight
        if weighed.requires_grad:  # this backward's reduce-scatters hold its context (dist/exit_guard.py)
            weighed.register_hook(lambda grad: note_backward_context())
        return weighed

    def require_weighed(self, fix: str) -> None:
        """Before an optimizer step: refuse gradients from a loss that skipped :meth:`weigh` (they would
        be summed unweighted, W times too large), naming ``fix``; then wait for the next step's."""
        if not self.weighed:
            raise RuntimeError(f"under FSDP2 this step's loss was not weighted by the rank's share b_r/G: {fix}")
        self.weighed = False


def _reshards_after_forward(module: Any) -> Any:
    # NOTE: FSDP2 has a setter but no getter (torch 2.14): the parameter group's post-forward mesh
    # (None: kept gathered after forward) is the flag, and may be a smaller mesh than the module's
    group = getattr(module._get_fsdp_state(), "_fsdp_param_group", None)
    return None if group is None else group.post_forward_mesh_info


def _set_reshards_after_forward(module: Any, mesh_info: Any) -> None:
    group = getattr(module._get_fsdp_state(), "_fsdp_param_group", None)
    if group is not None:
        group.post_forward_mesh_info = mesh_info


def _drop_accumulated_grads(module: Any) -> None:
    # NOTE: with a reduce dtype other than the parameters' (bf16 parameters, fp32 reduction), steps
    # without gradient sync move their gradients into FSDPParam.unsharded_accumulated_grad (torch
    # 2.14), which only a reduce-scatter clears: the probe's must not reach the first real step
    group = getattr(module._get_fsdp_state(), "_fsdp_param_group", None)
    for param in [] if group is None else group.fsdp_params:
        param.unsharded_accumulated_grad = None
