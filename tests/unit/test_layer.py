"""No mpinb module but the collective layer names an MPI communication method; one rank sends nothing."""

from __future__ import annotations

import ast
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

import mpinb
from support.counting import CountingComm, is_communication  # noqa: E402

PACKAGE = Path(mpinb.__file__).parent


def test_only_the_collective_layer_calls_mpi_communication() -> None:
    """Outside ``mpinb/_collective`` no code names an MPI communication method on anything but
    NumPy, TensorFlow, matplotlib, mpinb's public API and the layer's module, and none begins an
    operation of its own (``_collective.collective``): every protocol is one of the layer's named
    operations, so no code outside it holds an operation whose messages it could send."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] == "_collective":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            where = f"{path.relative_to(PACKAGE)}:{node.lineno}"
            if name == "collective" or (isinstance(func, ast.Attribute) and name == "begin"
                                        and "chan" in ast.unparse(func.value)):
                found.append(f"{where} begins an operation: {ast.unparse(func)}")
            elif isinstance(func, ast.Attribute) and is_communication(name):
                owner = ast.unparse(func.value)
                if owner.split(".")[0] not in {"tf", "np", "ax", "_collective", "mpinb"}:
                    found.append(f"{where} {owner}.{name}")
    assert not found, found


def test_one_rank_communicates_nothing() -> None:
    from mpi4py import MPI

    comm = CountingComm(MPI.COMM_SELF.Dup())
    out = mpinb.allreduce([np.ones(3), 2], comm=comm, timeout=0.001)
    assert np.array_equal(out[0], np.ones(3)) and out[1] == 2
    assert mpinb.bcast({"k": 1}, comm=comm) == {"k": 1}
    mpinb.check_all(True, "fine", comm=comm)
    km = mpinb.KMeans(2, random_state=0, comm=comm).fit(np.arange(20.0).reshape(10, 2))
    assert km.n_iter_ >= 1
    assert comm.calls == []


def test_a_world_pulled_to_the_client_carries_no_communicator() -> None:
    w = mpinb.world()
    copy = pickle.loads(pickle.dumps(w))
    assert copy.comm is None and repr(copy) == repr(w)
    # Unpickling it needs no mpi4py.MPI: the bytes do not mention it.
    assert b"mpi4py" not in pickle.dumps(w)


def test_client_modules_never_load_mpi() -> None:
    """Everything under ``mpinb/client`` runs in the notebook kernel, where MPI must not start."""
    import subprocess

    modules = [p.relative_to(PACKAGE.parent).with_suffix("").parts for p in (PACKAGE / "client").rglob("*.py")]
    names = sorted(".".join(parts[:-1] if parts[-1] == "__init__" else parts) for parts in modules)
    assert "mpinb.client.cluster" in names and "mpinb.client.plotting" in names
    code = f"import importlib, sys; [importlib.import_module(n) for n in {names!r}]; print('mpi4py.MPI' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_layout_packs_one_buffer_per_dtype_in_first_appearance_order() -> None:
    from mpinb._layout import Layout

    arrays = [np.arange(3, dtype=np.float32), np.array(7, dtype=np.int64), np.ones((2, 2), np.float32) * 5,
              np.zeros(0, np.float64)]
    plan = Layout([a.shape for a in arrays], [a.dtype for a in arrays])
    assert plan.dtypes == (np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.float64))
    assert plan.lengths == (7, 1, 0) and plan.members(0) == [0, 2]
    packed = plan.pack(arrays)
    assert packed[0].tolist() == [0, 1, 2, 5, 5, 5, 5]
    back = plan.views(packed)
    assert all(np.array_equal(a, b) and a.shape == b.shape for a, b in zip(arrays, back, strict=True))
    assert back[1].ndim == 0 and np.shares_memory(back[2], packed[0])


def test_aligned_layout_starts_every_array_on_the_boundary() -> None:
    from mpinb._layout import Layout

    plan = Layout([(3,), (5,), (2,)], [np.float32, np.float64, np.float32], align=64)
    assert plan.slots == ((0, 0, 3), (1, 0, 5), (0, 16, 18))
    assert plan.lengths == (18, 5)
    with pytest.raises(ValueError, match="tight"):
        plan.pack([np.zeros(3, np.float32), np.zeros(5), np.zeros(2, np.float32)])
