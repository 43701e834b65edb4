"""Which ``MPICluster`` the notebook's ``%%px`` runs on, said whenever that changes.

Client. ipyparallel's ``%%px`` runs on the view activated last, silently: a second cluster takes it
over, and once that one stops, ``%%px`` fails with "Client cannot be used after its sockets have
been closed" while the first cluster still runs. Here each cluster that activates ``%%px`` goes on
a stack: the newest running one holds ``%%px``; a change is said in one line naming both clusters
(by the notebook variables that hold them, when there are any); when the holder stops, ``%%px``
returns to the newest cluster still running, and says so; with none left, a ``%%px`` cell says
how to point it again. Outside IPython (a script) there is no ``%%px``, and nothing is said.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

__all__ = ["describe", "holder", "point_px_at", "stopped"]

_stack: list[weakref.ref[Any]] = []  # the clusters %%px ran on, the one it runs on last


def point_px_at(cluster: Any) -> None:
    """Make ``%%px`` run on ``cluster``'s ranks (an ``MPICluster`` that has a view); say so when it
    took ``%%px`` from another cluster that still runs."""
    from mpinb.client._ipp import activate

    before = holder()
    _forget(cluster)
    _stack.append(weakref.ref(cluster))
    shell = _shell()
    activate(cluster.view, cluster.deaths, owner=cluster)
    if shell is not None and before is not None and before is not cluster:
        _say(f"%%px now runs on {describe(cluster)}; {describe(before)} keeps running: "
             f"{_name_or(before, 'that cluster')}.activate() points %%px back at it.")


def stopped(cluster: Any) -> None:
    """``cluster`` stopped: if ``%%px`` ran on it, it runs on the newest cluster still running, if
    any (said in one line)."""
    top = _stack[-1]() if _stack else None  # not holder(): it skips a cluster already stopped
    _forget(cluster)
    if top is not cluster:
        return
    after = holder()
    if after is None:
        return  # a %%px cell now says how to point it again (_ipp.px_magics)
    from mpinb.client._ipp import activate

    activate(after.view, after.deaths, owner=after)
    if _shell() is not None:
        _say(f"%%px runs on {describe(after)} again: {describe(cluster)} stopped.")


def holder() -> Any:
    """The running cluster ``%%px`` runs on, or None."""
    while _stack:
        cluster = _stack[-1]()
        if cluster is not None and cluster.view is not None:
            return cluster
        _stack.pop()
    return None


def describe(cluster: Any) -> str:
    """``cluster`` as the user knows it: ``big (MPICluster n=4, started 13:20:11)``."""
    name = _name_or(cluster, "")
    what = f"MPICluster n={cluster.n}" + (f", started {cluster._since}" if getattr(cluster, "_since", "") else "")
    return f"{name} ({what})" if name else f"the {what}"


def _name_or(cluster: Any, default: str) -> str:
    """The notebook variable that holds ``cluster`` (the first, sorted), or ``default``."""
    shell = _shell()
    names = sorted(k for k, v in getattr(shell, "user_ns", {}).items() if v is cluster and not k.startswith("_"))
    return names[0] if names else default


def _forget(cluster: Any) -> None:
    _stack[:] = [ref for ref in _stack if ref() is not None and ref() is not cluster]


def _shell() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _say(text: str) -> None:
    print(f"mpinb: {text}", file=sys.stderr, flush=True)
