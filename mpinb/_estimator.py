"""What every estimator of mpinb shares around its own computation: the ``comm`` parameter left
out of pickles, and the agreement check that follows the local checks of a fit.

A fit of any mpinb estimator begins the same way: parameters and rows checked on each rank inside
:func:`mpinb.raise_together` (one error, on every rank; see :mod:`mpinb._inputs` and
:mod:`mpinb._constraints`), then :func:`agree` -- the same configuration and the same number of
features on every rank -- before the first collective that moves data.

Private; collective unless a function says local.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from mpinb.agreement import check_same

__all__ = ["RankAware", "agree", "set_feature_names"]


class RankAware:
    """Mixin of mpinb's estimators, placed before scikit-learn's ``BaseEstimator``: a pickled
    model keeps arrays and scalars only; each class's ``fit`` runs as one mpinb call (see
    :func:`mpinb._collective.collective_call`: a rank whose own code raises inside it between two
    collectives ends the other ranks' waits)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fit = cls.__dict__.get("fit")
        if callable(fit) and not getattr(fit, "_mpinb_call", False):
            cls.fit = _one_call(fit)  # type: ignore[attr-defined]

    def __getstate__(self) -> dict[str, Any]:
        # A communicator belongs to the processes that created it; a pickled model (pulled to the
        # notebook client, say) uses COMM_WORLD if refitted.
        state = cast(dict[str, Any], super().__getstate__())  # scikit-learn's: a copy of __dict__
        state["comm"] = None
        state.pop("_on_iteration", None)
        return state


def _one_call(fit: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fit)
    def one_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        from mpinb._checks import default_comm
        from mpinb._collective import collective_call

        with collective_call(f"{type(self).__name__}.fit", default_comm(getattr(self, "comm", None))):
            return fit(self, *args, **kwargs)

    one_call._mpinb_call = True  # type: ignore[attr-defined]
    return one_call


def agree(config: Any, n_features: int | None, name: str, *, comm: Any, names: np.ndarray | None = None) -> None:
    """Raise :class:`mpinb.CollectiveMismatchError` on every rank unless ``config`` (a
    description of the checked parameters, see :func:`mpinb._constraints.describe`) and, unless
    ``n_features`` is ``None`` (a resumed fit, checked against the model on each rank), the number
    of features and their ``names`` (:func:`mpinb._inputs.feature_names`, ``None`` for none) are
    the same on every rank. ``name`` is the estimator's class name.
    Collective: one to three small checks, moving no data unless they fail."""
    check_same(config, f"the {name} configuration", comm=comm)
    if n_features is not None:
        check_same(n_features, "the number of features (columns of X_local)", comm=comm)
        # A rank without rows passes a DataFrame too (X.iloc[:0]): a model's names are everyone's.
        check_same(None if names is None else [str(n) for n in names],
                   "the feature names of X_local (its DataFrame's column names; None: an array, or columns not "
                   "all named by strings)", comm=comm)


def set_feature_names(est: Any, names: np.ndarray | None) -> None:
    """Set ``feature_names_in_`` as scikit-learn's fit does: the names, or no attribute at all. Local."""
    if names is not None:
        est.feature_names_in_ = names
    else:
        est.__dict__.pop("feature_names_in_", None)
