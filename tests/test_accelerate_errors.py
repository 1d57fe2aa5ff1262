"""HeteroPlugin refuses what it cannot honour, with the field, the value and the fix; and it needs no Lightning."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator, DataLoaderConfiguration, DistributedDataParallelKwargs
from accelerate.state import AcceleratorState
from accelerate.utils import DDPCommunicationHookType, DistributedType
from dist_utils import init_gloo, run_distributed
from oracle import make_data, make_net
from torch.utils.data import (
    DataLoader,
    IterableDataset,
    RandomSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from hetero_strategy.accelerate import HeteroPlugin
from hetero_strategy.accelerate.checks import check_accelerator, second_hook_error
from hetero_strategy.config import ConfigError


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def _objects(loader=None):
    net = make_net()
    return net, torch.optim.SGD(net.parameters(), lr=0.1), loader if loader is not None else DataLoader(make_data(32), batch_size=8)


def test_single_process_gets_the_whole_global_batch():
    _, _, loader = HeteroPlugin().prepare(Accelerator(cpu=True), *_objects())
    assert [len(x) for x, _ in loader] == [8] * 4  # world 1: b_0 = G = B


@pytest.mark.parametrize(("kwargs", "words"), [
    (dict(dataloader_config=DataLoaderConfiguration(split_batches=True)), ["split_batches=True", "split_batches=False"]),
    (dict(dataloader_config=DataLoaderConfiguration(dispatch_batches=True)), ["dispatch_batches=True", "map-style"]),
    (dict(kwargs_handlers=[DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.FP16)]),
     ["comm_hook", "compression="]),
])
def test_accelerator_settings_it_cannot_honour(kwargs, words):
    with pytest.raises(ConfigError) as e:
        HeteroPlugin().prepare(Accelerator(cpu=True, **kwargs), *_objects())
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("kind", [DistributedType.DEEPSPEED, DistributedType.MEGATRON_LM])
def test_sharded_distributed_types_are_refused_with_what_to_use(kind):
    fake = SimpleNamespace(distributed_type=kind, split_batches=False, dispatch_batches=False, ddp_handler=None)
    with pytest.raises(ConfigError, match=f"distributed_type={kind.name} is invalid.*launch with DDP"):
        check_accelerator(fake)


def test_fsdp1_is_refused_naming_fsdp_version_2():
    fake = SimpleNamespace(distributed_type=DistributedType.FSDP, is_fsdp2=False, split_batches=False,
                           dispatch_batches=False, ddp_handler=None)
    with pytest.raises(ConfigError, match=r"fsdp_version=1\) is invalid.*use fsdp_version=2"):
        check_accelerator(fake)


def test_iterable_dataset_is_refused():
    class Stream(IterableDataset):
        def __iter__(self):
            yield from make_data(8)

    with pytest.raises(ConfigError, match="IterableDataset cannot be split"):
        HeteroPlugin().prepare(Accelerator(cpu=True), *_objects(DataLoader(Stream(), batch_size=4)))


@pytest.mark.parametrize("sampler", [
    SubsetRandomSampler(range(10)),
    WeightedRandomSampler([0.0] + [1.0] * 31, num_samples=32),
    RandomSampler(range(32), replacement=True),
], ids=lambda s: type(s).__name__)
def test_a_sampler_hetero_would_drop_is_refused(sampler):
    loader = DataLoader(make_data(32), batch_size=8, sampler=sampler)
    with pytest.raises(ConfigError, match=f"DataLoader.sampler={type(sampler).__name__} is invalid.*Subset"):
        HeteroPlugin().prepare(Accelerator(cpu=True), *_objects(loader))


def test_a_stateful_loader_is_refused():
    fake = SimpleNamespace(distributed_type=DistributedType.MULTI_CPU, split_batches=False, dispatch_batches=False,
                           use_stateful_dataloader=True, ddp_handler=None)
    with pytest.raises(ConfigError, match=r"use_stateful_dataloader=True\) is invalid.*set_epoch"):
        check_accelerator(fake)


def test_missing_training_loader_and_bad_fields():
    net, opt, _ = _objects()
    with pytest.raises(ConfigError, match=r"objects=\(Sequential, SGD\) is invalid.*training DataLoader"):
        HeteroPlugin().prepare(Accelerator(cpu=True), net, opt)
    with pytest.raises(ConfigError, match=r"batch_sizes\[0\]=0 is invalid"):
        HeteroPlugin(batch_sizes=[0, 16])
    with pytest.raises(ConfigError, match="bogus=1 is invalid: unknown option"):
        HeteroPlugin(bogus=1)
    with pytest.raises(ConfigError, match="log_every_n_steps=0"):
        HeteroPlugin(log_every_n_steps=0)


def test_per_rank_list_of_the_wrong_length_fails_at_prepare():
    with pytest.raises(ConfigError, match="has 2 entries but the job has 1 rank;"):
        HeteroPlugin(batch_sizes=[3, 5]).prepare(Accelerator(cpu=True), *_objects())


def test_config_path_from_the_environment(tmp_path, monkeypatch):
    from hetero_strategy.config import HeteroConfig

    path = tmp_path / "hetero.yaml"
    HeteroConfig.from_flat(compression="topk", base_density=0.05).to_yaml(path)
    monkeypatch.setenv("HETERO_STRATEGY_CONFIG", str(path))
    assert HeteroPlugin().config.compression.base_density == 0.05
    assert HeteroPlugin(base_density=0.2).config.compression.base_density == 0.2  # keywords win
    monkeypatch.setenv("HETERO_STRATEGY_CONFIG", str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="missing.yaml.*no such file"):
        HeteroPlugin()


def _second_hook(rank: int, world: int) -> str:
    from torch.nn.parallel import DistributedDataParallel

    from hetero_strategy.config import HeteroConfig
    from hetero_strategy.runtime import HeteroRuntime

    init_gloo(rank, world)
    ddp = DistributedDataParallel(make_net())
    ddp.register_comm_hook(None, lambda state, bucket: None)
    try:
        HeteroRuntime(HeteroConfig(), rank, world).register_hook(ddp)
    except RuntimeError as e:
        return str(second_hook_error(e))
    return "no error"


def test_a_second_comm_hook_is_explained():
    message = run_distributed(_second_hook, 1, timeout=60)[0]
    assert "already has a DDP comm hook" in message and "compression=" in message


_NO_LIGHTNING = textwrap.dedent("""
    import importlib.abc, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("lightning", "pytorch_lightning"):
                raise ImportError(f"{name} is blocked in this test")

    sys.meta_path.insert(0, Block())
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from accelerate import Accelerator
    import hetero_strategy, hetero_strategy.hooks, hetero_strategy.runtime, hetero_strategy.triton_kernels
    from hetero_strategy.accelerate import HeteroPlugin

    torch.manual_seed(0)
    x = torch.randn(64, 4); y = x.sum(1, keepdim=True)
    net = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    plugin = HeteroPlugin(compression="topk", dense_warmup_steps=1)   # no sizes: the probe runs
    acc = Accelerator(cpu=True)
    model, opt, loader = plugin.prepare(acc, net, opt, DataLoader(TensorDataset(x, y), batch_size=16),
                                        loss_fn=lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]))
    losses = []
    for _ in range(3):
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            acc.backward(loss); opt.step(); opt.zero_grad(); losses.append(loss.item())
    assert losses[-1] < losses[0], losses
    assert not any(m.split(".")[0] in ("lightning", "pytorch_lightning") for m in sys.modules)
    print("trained without lightning", plugin.batch_sizes)
""")


def test_hooks_runtime_and_plugin_need_no_lightning():
    out = subprocess.run([sys.executable, "-c", _NO_LIGHTNING], capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "trained without lightning [16]" in out.stdout
