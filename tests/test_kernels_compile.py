"""Every kernel compiles for real GPUs (V100 sm_70, A100 sm_80, H100/H200 sm_90), without a GPU.

The interpreter accepts code the compiler rejects (and vice versa), so the CPU tests alone do
not prove the kernels build. ``triton.compile`` with an explicit ``GPUTarget`` lowers to PTX
and runs ptxas (bundled with Triton) on this machine. It runs in a subprocess because
``TRITON_INTERPRET=1`` (set for the other kernel tests) makes ``triton.jit`` build interpreter
objects, which cannot be compiled.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton", reason="Triton is not installed; only the torch references can run")

SCRIPT = r'''
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from hetero_strategy.triton_kernels import compact as cp, ef_accumulate as ef, scatter_add as sa, threshold as th
from hetero_strategy.triton_kernels import threshold_select as tsel

P32, I32 = "*fp32", "*i32"
ptrs = lambda names, t: {n: t for n in names}
hist = lambda src: {"src_ptr": src, **ptrs(["src_count_ptr", "state_ptr", "hist_ptr", "cand_ptr", "cand_count_ptr",
                    "seg_ptr", "counts_ptr"], I32), "n": "i32", "num_blocks": "i32"}
SPECS = [
    (th._radix_hist_kernel, hist(P32), dict(SHIFT=20, WIDTH=11, NUM_BINS=2048, FIRST=True, SRC_IS_KEYS=False,
                                           APPEND=False, BLOCK=4096)),
    (th._radix_hist_kernel, hist(P32), dict(SHIFT=10, WIDTH=10, NUM_BINS=1024, FIRST=False, SRC_IS_KEYS=False,
                                           APPEND=True, BLOCK=4096)),
    (th._radix_hist_kernel, hist(I32), dict(SHIFT=0, WIDTH=10, NUM_BINS=1024, FIRST=False, SRC_IS_KEYS=True,
                                           APPEND=False, BLOCK=4096)),
    (th._radix_scan_kernel, {"hist_ptr": I32, "state_ptr": I32, "k": "i32"}, dict(SHIFT=20, NUM_BINS=2048, FIRST=True)),
    (th._radix_scan_kernel, {"hist_ptr": I32, "state_ptr": I32, "k": "i32"}, dict(SHIFT=0, NUM_BINS=1024, FIRST=False)),
    (th._candidate_count_kernel, {**ptrs(["cand_ptr", "seg_ptr", "state_ptr", "counts_ptr"], I32),
                                  "num_blocks": "i32"}, dict(BLOCK=4096)),
    (cp._count_kernel, {"acc_ptr": P32, "state_ptr": I32, "counts_ptr": I32, "n": "i32", "num_blocks": "i32"},
     dict(LOW=0, BLOCK=4096)),
    (cp._write_kernel, {"acc_ptr": P32, **ptrs(["state_ptr", "counts_ptr", "incl_ptr"], I32), "values_ptr": P32,
                        **ptrs(["indices_ptr", "count_ptr"], I32), "residual_ptr": P32, "n": "i32",
                        "num_blocks": "i32", "capacity": "i32"}, dict(LOW=10, BLOCK=4096)),
    (ef._ef_accumulate_kernel, {"grad_ptr": "*bf16", "residual_ptr": P32, "acc_ptr": P32, "gamma": "fp32",
                                "n": "i32"}, dict(HAS_RESIDUAL=True, BLOCK=1024)),
    (ef._ef_accumulate_kernel, {"grad_ptr": "*fp16", "residual_ptr": P32, "acc_ptr": P32, "gamma": "fp32",
                                "n": "i32"}, dict(HAS_RESIDUAL=False, BLOCK=1024)),
    (tsel._count_kernel, {"acc_ptr": P32, **ptrs(["seg_ptr", "start_ptr", "end_ptr", "thr_ptr", "counts_ptr"], I32),
                          "num_progs": "i32"}, dict(BLOCK=4096)),
    (tsel._write_kernel, {"acc_ptr": P32, **ptrs(["seg_ptr", "start_ptr", "end_ptr", "thr_ptr", "base_ptr", "cap_ptr",
                                                  "before_ptr"], I32), "values_ptr": P32, "indices_ptr": I32,
                          "num_progs": "i32"}, dict(BLOCK=4096)),
    (sa._scatter_add_kernel, {"values_ptr": "*bf16", "indices_ptr": "*i64", "weights_ptr": P32, "out_ptr": P32,
                              "row": "i32", "width": "i32", "n": "i32"}, dict(HAS_WEIGHTS=True, BLOCK=1024)),
]
for cc in (70, 80, 90):
    for fn, sig, const in SPECS:
        sig = {**sig, **{name: "constexpr" for name in const}}
        triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const), target=GPUTarget("cuda", cc, 32),
                       options={"enable_fp_fusion": False})
        print("compiled", cc, fn.__name__, flush=True)
'''


def test_all_kernels_compile_for_sm70_sm80_sm90(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], check=False, capture_output=True, text=True,
                          timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("compiled") == 3 * 13
