"""dist/exit_guard.py: a process waits at exit until gloo lets go of the last backward's context."""

from __future__ import annotations

import atexit
import contextvars
import threading
import time

import pytest
import torch

from hetero_strategy.config import HeteroConfig
from hetero_strategy.dist import exit_guard
from hetero_strategy.hooks import build_comm_hook
from hetero_strategy.runtime.fsdp import ShardedReduction


@pytest.fixture(autouse=True)
def _nothing_held():
    exit_guard.wait_for_release(timeout_s=0)  # an earlier test's backward: forget it, unregister
    yield
    exit_guard.wait_for_release(timeout_s=0)


def _backward_noting() -> None:
    w = torch.ones(3, requires_grad=True)
    y = (w * 2).sum()
    y.register_hook(lambda grad: exit_guard.note_backward_context())
    y.backward()


def _hold_for(seconds: float) -> threading.Thread:
    """A thread holding the noted context for ``seconds``, as a gloo work holds it after it ran."""
    held = [exit_guard._held[0]]

    def let_go() -> None:
        time.sleep(seconds)
        held.clear()

    thread = threading.Thread(target=let_go)
    thread.start()
    return thread


def test_inside_backward_the_context_is_noted_and_the_exit_handler_registered():
    before = atexit._ncallbacks()
    _backward_noting()
    assert len(exit_guard._held) == 1 and isinstance(exit_guard._held[0], contextvars.Context)
    assert atexit._ncallbacks() == before + 1
    _backward_noting()  # a second backward replaces it; the handler is not registered twice
    assert len(exit_guard._held) == 1 and atexit._ncallbacks() == before + 1
    assert exit_guard.wait_for_release(timeout_s=1.0)
    assert not exit_guard._held  # (unregistered too; CPython 3.11's count keeps the emptied slot)


def test_outside_backward_nothing_is_noted():
    exit_guard.note_backward_context()
    assert not exit_guard._held
    assert exit_guard.wait_for_release(timeout_s=0)


def test_the_wait_lasts_until_the_last_holder_lets_go():
    _backward_noting()
    thread = _hold_for(0.3)
    start = time.monotonic()
    assert exit_guard.wait_for_release(timeout_s=10.0)
    waited = time.monotonic() - start
    thread.join()
    assert 0.25 <= waited < 5.0, waited


def test_the_wait_gives_up_after_its_bound():
    _backward_noting()
    thread = _hold_for(3.0)
    start = time.monotonic()
    assert not exit_guard.wait_for_release(timeout_s=0.2)
    assert 0.2 <= time.monotonic() - start < 2.0
    thread.join()


@pytest.fixture
def world_of_one():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("method", ["none", "topk", "fp16"])
def test_a_ddp_backward_through_the_built_hook_notes_its_context(world_of_one, method):
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(torch.nn.Linear(4, 2))
    state, hook = build_comm_hook(HeteroConfig.from_flat(compression=method), max_steps=10)
    model.register_comm_hook(state, hook)
    state.set_local_batch(3, 3)
    before = model.module.weight.detach().clone()
    model(torch.randn(3, 4)).sum().backward()
    assert isinstance(exit_guard._held[0], contextvars.Context)
    assert model.module.weight.grad is not None and torch.equal(model.module.weight, before)
    assert exit_guard.wait_for_release(timeout_s=5.0)  # the one-rank work is done and dropped


class _FakeShardedModule:
    """What ShardedReduction asks of an FSDP2 module when it is built."""

    def set_force_sum_reduction_for_comms(self, on: bool) -> None:
        pass

    def set_gradient_divide_factor(self, factor: float) -> None:
        pass


def test_the_fsdp2_loss_notes_the_context_of_its_backward():
    reduction = ShardedReduction([_FakeShardedModule()], world_size=2)
    w = torch.ones(3, requires_grad=True)
    reduction.weigh((w * 2).sum()).backward()
    assert isinstance(exit_guard._held[0], contextvars.Context)
    assert torch.equal(w.grad, torch.full((3,), 1.0))  # 2 x the weight 1/2: the hook changed nothing
