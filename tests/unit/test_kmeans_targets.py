"""The compiled k-means assignment gives the NumPy path's labels whatever CPU numba compiles for:
AVX2 (``haswell``) and SSE2 alone (``x86-64``), each in a fresh process with a cache of its own.

``NUMBA_CPU_NAME`` alone does not choose the instructions: numba adds the host's features unless
``NUMBA_CPU_FEATURES`` is set (to "" for the named CPU's own), so under ``NUMBA_CPU_NAME=x86-64``
alone an AVX-512 host still compiled with 256-bit registers. Each compilation from an empty cache
takes about a minute on a loaded 2-core machine: ``tests/run.py --tier mpis`` runs this file
(``MPINB_TEST_CPU_TARGETS=1``), the unit tier skips it."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytest.importorskip("numba")
pytestmark = pytest.mark.skipif(os.environ.get("MPINB_TEST_CPU_TARGETS") != "1",
                                reason="about a minute per target: run by tests/run.py --tier mpis")

_CHILD = r"""
import json
import numba
import numpy as np
from mpinb.kmeans import _kernels
from mpinb.kmeans._distances import assign
from mpinb.kmeans._kernels import COMPILE_FROM, kernels

compiled = kernels(COMPILE_FROM)

@numba.njit
def doubled_sum(a):
    return (a * 2.0).sum()

doubled_sum(np.ones(64))
asm = next(iter(doubled_sum.inspect_asm().values()))
differ, simd = {}, {}
for k, d in [(2, 1), (7, 3), (21, 5), (64, 16), (130, 40)]:
    for dtype in (np.float64, np.float32):
        rng = np.random.default_rng(k * d)
        # Small integers: every product and sum is exact, so both paths see the same ties; the
        # duplicated centres sit in different lanes of both widths (8 and 16), the lower index wins.
        X = rng.integers(-3, 4, size=(1003, d)).astype(dtype)
        centres = rng.integers(-3, 4, size=(k, d)).astype(np.float64)
        if k > 9:
            centres[9], centres[k - 1] = centres[0], centres[1]
        if dtype == np.float64 and k == 21:  # and rows of real numbers, near-ties and all
            X = np.vstack([X, rng.normal(size=(1000, d))])
        labels = {}
        for ex in (compiled, _kernels.NUMPY):
            out = np.full(len(X), -1, dtype=np.int32)
            assign(X, centres, np.zeros(d), out, run_on=ex)
            labels[ex.name] = out
        case = f"{k}x{d} {np.dtype(dtype).name}"
        differ[case] = int((labels["compiled"] != labels["numpy"]).sum())
        simd[case] = compiled.simd_width(k, d, dtype)
print(json.dumps({"cpu": numba.config.CPU_NAME, "ymm": "ymm" in asm, "zmm": "zmm" in asm, "differ": differ,
                  "simd": simd}))
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the targets are x86-64 CPUs")
@pytest.mark.parametrize("target, vectors", [("haswell", True), ("x86-64", False)])
def test_simd_labels_equal_the_numpy_paths_on_every_target(target: str, vectors: bool, tmp_path) -> None:
    env = dict(os.environ, NUMBA_CPU_NAME=target, NUMBA_CPU_FEATURES="", NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               MPINB_NUMBA="on")
    done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    # The target reached code generation: 256-bit registers for AVX2, none for SSE2 alone, and
    # never the 512-bit ones of this host's AVX-512 (if it has it).
    assert found["cpu"] == target and found["ymm"] is vectors and not found["zmm"], found
    assert any(found["simd"].values()), found  # the SIMD assignment ran, not only the GEMM fallback
    assert found["differ"] == dict.fromkeys(found["differ"], 0), found
