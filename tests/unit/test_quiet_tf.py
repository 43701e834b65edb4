"""TensorFlow's C++ start-up lines stay out of every rank's output unless the user asked for them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

NOISE = ("All log messages before absl::InitializeLog()", "oneDNN custom operations")


def _stderr(code: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**base, **env},
                         timeout=300, check=True)
    return out.stderr


@pytest.mark.parametrize("code", [
    "import mpinb.keras",
    # How an engine that MPICluster started sees it: the hook first, then the user's own import.
    "import mpinb._quiet_tf as q; q.quiet_future_import(); import keras; import tensorflow as tf; tf.ones(2) + 1",
])
def test_tensorflow_starts_quietly(code: str) -> None:
    err = _stderr(code + "; import sys; print('kept', file=sys.stderr)")
    assert not [line for line in err.splitlines() if any(n in line for n in NOISE)], err
    assert "kept" in err  # stderr itself still works after the capture


def test_a_log_level_the_user_set_is_respected() -> None:
    # The same import, with the user's own level: TensorFlow prints what it prints by default
    # (this also shows the quiet test above could fail).
    err = _stderr("import mpinb.keras", TF_CPP_MIN_LOG_LEVEL="0")
    assert any("oneDNN" in line or "cpu_feature_guard" in line for line in err.splitlines()), err
