"""What the notebook's own kernel may and may not do with a real MPICluster(n=2), through a real
IPython shell: a collective typed outside ``%%px`` raises (the ranks are the engines), ``%%px`` runs
it on the ranks, an estimator fits on rows gathered to the client; and a folder named ``mpinb`` in
the directory the engines start in fails the start with a sentence that says what shadows what."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from IPython.core.interactiveshell import InteractiveShell

from mpinb._shadow import in_directory
from mpinb.client import MPICluster


@pytest.fixture
def shell() -> Iterator[InteractiveShell]:
    # Made before the cluster, so that its start registers %%px on this shell (get_ipython() is it).
    ip = InteractiveShell.instance()
    yield ip
    InteractiveShell.clear_instance()


def test_a_collective_in_the_kernel_raises_while_px_runs_it_on_the_ranks(shell: InteractiveShell) -> None:
    with MPICluster(n=2) as cluster:
        typed = shell.run_cell("import mpinb, numpy as np\ntotal = mpinb.allreduce([np.ones(3)])", silent=True)
        error = typed.error_in_exec
        assert isinstance(error, RuntimeError), error
        assert str(error).startswith(
            "mpinb.allreduce() is a collective of the MPI ranks, and this process is not one of them: it is the "
            "client of a running MPICluster, whose ranks are its 2 engines. Run it in a %%px cell"
        ), error
        assert "total" not in shell.user_ns
        ran = shell.run_cell("%%px\nimport mpinb, numpy as np\ntotal = mpinb.allreduce([np.ones(3)])[0]\n"
                             "X = np.arange(12.0).reshape(6, 2) + 100 * mpinb.world().rank", silent=True)
        assert ran.error_in_exec is None, ran.error_in_exec
        assert [t.tolist() for t in cluster.pull("total")] == [[2.0, 2.0, 2.0]] * 2
        # Rows gathered to the client, fitted there: legitimate, on this process alone.
        shell.user_ns["X"] = cluster.gather("X")
        fitted = shell.run_cell("km = mpinb.KMeans(2, random_state=0).fit(X)", silent=True)
        assert fitted.error_in_exec is None, fitted.error_in_exec
        assert sorted(shell.user_ns["km"].cluster_centers_[:, 0].tolist()) == [5.0, 105.0]


def test_a_folder_named_mpinb_where_the_engines_start_fails_the_start_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mpinb").mkdir()  # the notebook in a clone's parent, the clone named mpinb
    if in_directory(tmp_path) is None:
        pytest.skip("mpinb is installed as a regular package here, which a namespace folder cannot shadow")
    monkeypatch.chdir(tmp_path)  # the notebook's directory: the engines start in it
    began = time.monotonic()
    with pytest.raises(Exception) as raised:  # noqa: PT011 - ipyparallel's composite of the engines' ImportErrors
        MPICluster(n=2)
    text = str(raised.value) + "".join(str(e) for e in getattr(raised.value, "elist", []))
    print(f"start failed after {time.monotonic() - began:.1f} s: {text}")
    assert f"`import mpinb` found the folder {tmp_path / 'mpinb'}, not the installed mpinb" in text, text
    assert "no mpinb.world" in text and "Start Jupyter (or run the script) from another directory" in text
    assert "has no attribute 'world'" not in text
    np.testing.assert_equal(sorted(p.name for p in tmp_path.iterdir()), ["mpinb"])  # nothing left here either
