"""The wire model of each codec (cluster/wire.py) by hand, against what the hooks count on two
loopback ranks, and the scaling bench's summary on a hand-made measurement."""

from __future__ import annotations

import os

import pytest
from dist_utils import init_gloo, run_distributed

from hetero_strategy.cluster.wire import bytes_per_rank

SHAPES = [[(100, 50), (50,)]]  # one bucket: a 5000-entry matrix and its 50-entry bias


def test_bytes_per_rank_by_hand() -> None:
    # W = 4: a ring all-reduce sends 2*3/4 = 1.5 B per payload byte, an all-gather 3, a broadcast 0.75
    assert bytes_per_rank("dense", SHAPES, 4) == pytest.approx(1.5 * 4 * 5050)
    assert bytes_per_rank("fp16", SHAPES, 4) == pytest.approx(1.5 * 2 * 5050)
    # k = 50 and 1: both sparse; 8 bytes (value + index) per entry and a 4-byte marker, from 3 peers
    assert bytes_per_rank("topk", SHAPES, 4, density=0.01) == pytest.approx(3 * (8 * 51 + 4))
    # the same k: values (and the marker) all-reduced at 1.5 x 4 B, indices broadcast at 0.75 x 4 B
    assert bytes_per_rank("topk_allreduce", SHAPES, 4, density=0.01) == pytest.approx(52 * 6 + 51 * 3)
    # PowerSGD rank 4: P (100 x 4) and Q (50 x 4) for the matrix; the bias (50 x 1) goes whole
    assert bytes_per_rank("powersgd", SHAPES, 4) == pytest.approx(1.5 * 4 * (600 + 50))
    # a 10-entry tensor at density 0.2 on 8 ranks (k = 2): gathering 2 x 8 entries outweighs it, so
    # topk sends it dense (1.75 x 40 B); shared indices need 1.5 x 2 < 10 and stay sparse
    assert bytes_per_rank("topk", [[(10,)]], 8, density=0.2) == pytest.approx(1.75 * (40 + 4))
    assert bytes_per_rank("topk_allreduce", [[(10,)]], 8, density=0.2) == pytest.approx(1.75 * 12 + 0.875 * 8)
    # the transport's numbers: per payload byte, and per message (a ring all-reduce on 4 ranks sends
    # 2 x 3 messages; PowerSGD issues three all-reduces here: the uncompressed bias, P, Q; a
    # broadcast's messages average 3/4 per rank)
    assert bytes_per_rank("dense", SHAPES, 4, framing=1.1, per_message=100) == pytest.approx(1.1 * 1.5 * 4 * 5050
                                                                                           + 100 * 6)
    assert bytes_per_rank("powersgd", SHAPES, 4, framing=0.0, per_message=1.0) == pytest.approx(3 * 6)
    assert bytes_per_rank("topk_allreduce", SHAPES, 4, framing=0.0, per_message=1.0) == pytest.approx(6 + 0.75)
    assert bytes_per_rank("dense", SHAPES, 1) == 0.0
    with pytest.raises(ValueError, match="codec='gzip' is invalid"):
        bytes_per_rank("gzip", SHAPES, 2)


def test_growth_with_the_world_size() -> None:
    """All-gather Top-K grows with W - 1; the shared-index codec stays within 2(W-1)/W's 1.75x."""
    shapes = [[(256, 1024), (256,)]]
    gather = bytes_per_rank("topk", shapes, 8) / bytes_per_rank("topk", shapes, 2)
    shared = bytes_per_rank("topk_allreduce", shapes, 8) / bytes_per_rank("topk_allreduce", shapes, 2)
    assert gather == pytest.approx(7.0)
    assert shared == pytest.approx(1.75)


def _hook_bytes(rank: int, world: int) -> dict:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    init_gloo(rank, world)
    from hetero_bench.compression_scaling_worker import _measure

    return {c: _measure(c, steps=3) for c in ("dense", "fp16", "topk", "topk_allreduce", "powersgd")}


def test_the_model_predicts_what_the_hooks_send_and_the_summary() -> None:
    from hetero_bench.compression_e2e import make_cnn
    from hetero_bench.compression_scaling import summarise

    out = run_distributed(_hook_bytes, 2, timeout=180)[0]
    buckets = out["dense"]["buckets"]
    assert sorted(s for b in buckets for s in b) == sorted(tuple(p.shape) for p in make_cnn().parameters())
    for codec, got in out.items():
        assert got["buckets"] == buckets  # one layout for every codec
        model = bytes_per_rank(codec, buckets, 2, density=0.01)
        for hook in got["hook_bytes_per_rank"]:
            if codec == "fp16":  # torch's fp16 hook counts nothing itself: the bench counts it by the ring
                assert hook == pytest.approx(model)
                continue
            # the hooks' non-finite markers (4 bytes per collective) are not in the model
            assert hook == pytest.approx(model, rel=2e-3, abs=64), codec
        # loopback carries both ranks' traffic: each rank's counter sees at least its own bytes
        assert min(got["wire_bytes_per_rank"]) >= model
    fake = {2: out, 4: out}  # the summary's arithmetic on a hand-made measurement
    s = summarise(fake, buckets)
    # the two fitted numbers reproduce both points they were fitted on
    assert s["model_error"]["dense"]["2"] == pytest.approx(0.0, abs=1e-9)
    assert s["model_error"]["powersgd"]["2"] == pytest.approx(0.0, abs=1e-9)
    assert s["framing_factor"] > 0
    assert set(s["model_bytes_per_rank_per_step"]["topk"]) >= {"2", "8", "1024"}
