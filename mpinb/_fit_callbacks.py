"""scikit-learn's fit callbacks (``sklearn.callback``, experimental in scikit-learn 1.9) on mpinb's
estimators: the hooks run on rank 0 only, with the reduced values that every rank holds.

A fit is collective and leaves its loop on reduced values, so a hook must neither communicate nor
decide anything. Rank 0 calls the hooks between two of the fit's own collectives and the other ranks
call nothing: a ``ProgressBar`` or a ``ScoringMonitor`` set on every rank shows one bar and keeps one
log, of the global iterations. What a hook can reach cannot start a collective either: the
``fitted_estimator`` it gets is a copy on ``MPI.COMM_SELF``, and ``X`` is rank 0's own rows. A
hook's request to stop (``on_fit_task_end`` returning true) is ignored, as scikit-learn 1.9's own
estimators ignore it; honouring it would need rank 0's answer on every rank before the next
iteration. A hook that raises ends the fit on rank 0 between two collectives, which the fit's
:func:`~mpinb._collective.collective_call` turns into an error on every rank.

Where scikit-learn has no ``sklearn.callback`` (before 1.9) nothing here imports it and the
estimators are unchanged: :data:`CallbackSupport` adds no method, :func:`with_callbacks` returns
``fit`` as it is and :func:`fit_callbacks` the no-op.

Private; local (nothing here communicates).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "AVAILABLE", "NO_CALLBACKS", "Attributes", "CallbackSupport", "FitCallbacks", "fit_callbacks", "with_callbacks",
]

# A model's fitted attributes, built only if a hook asks for a ``fitted_estimator``.
Attributes = Callable[[], dict[str, Any]]

try:  # scikit-learn >= 1.9
    from sklearn.callback import CallbackSupportMixin as CallbackSupport
    from sklearn.callback import with_callbacks as _with_callbacks

    AVAILABLE = True
except ImportError:  # scikit-learn 1.5-1.8

    class CallbackSupport:  # type: ignore[no-redef]
        """Where ``sklearn.callback`` does not exist: adds nothing (no ``set_callbacks``)."""

    _with_callbacks = None
    AVAILABLE = False


def with_callbacks(fit: Callable[..., Any]) -> Callable[..., Any]:
    """scikit-learn's ``with_callbacks`` (the hooks' ``teardown`` after ``fit``, even when it
    raises) where it exists, else ``fit`` itself."""
    return fit if _with_callbacks is None else _with_callbacks(fit)


class FitCallbacks:
    """The task tree of one fit as scikit-learn's hooks see it: :meth:`begin` and :meth:`end` of
    the fit (``parent=None``) or of a subtask. Rank 0's, with callbacks set; elsewhere the no-op
    :data:`NO_CALLBACKS`, whose :attr:`active` is false so loops skip their hooks entirely."""

    active = True

    def __init__(self, estimator: Any, root: Any, X: Any, metadata: dict[str, Any] | None) -> None:
        self.estimator, self.root, self.X, self.metadata = estimator, root, X, metadata

    def subtask(
        self, name: str, parent: Any = None, max_subtasks: int = 0, attributes: Attributes | None = None
    ) -> Any:
        """A new subtask of ``parent`` (the fit when ``None``), begun (``attributes`` as in
        :meth:`begin`)."""
        ctx = (self.root if parent is None else parent).subcontext(task_name=name, max_subtasks=max_subtasks)
        self.begin(ctx, attributes)
        return ctx

    def begin(self, ctx: Any, attributes: Attributes | None = None) -> None:
        """``on_fit_task_begin`` of task ``ctx``; ``attributes`` (called only if a hook asks for a
        ``fitted_estimator``) give the model as it stands, ``None`` no model (the fit's start)."""
        ctx.call_on_fit_task_begin(estimator=self.estimator, X=self.X, metadata=self.metadata,
                                   reconstruction_attributes=None if attributes is None else _local(attributes))

    def end(self, ctx: Any, attributes: Attributes | None = None) -> None:
        """``on_fit_task_end`` of task ``ctx``, ``attributes`` as in :meth:`begin` (``None``: the
        estimator as it is, fitted at the fit's end). Its answer (stop?) is rank 0's alone: ignored."""
        ctx.call_on_fit_task_end(estimator=self.estimator, X=self.X, metadata=self.metadata,
                                 reconstruction_attributes=_local(attributes or dict))


class _NoCallbacks(FitCallbacks):
    active = False

    def __init__(self) -> None:
        self.estimator = self.root = self.X = self.metadata = None

    def subtask(
        self, name: str, parent: Any = None, max_subtasks: int = 0, attributes: Attributes | None = None
    ) -> Any:
        return None

    def begin(self, ctx: Any, attributes: Attributes | None = None) -> None:
        pass

    def end(self, ctx: Any, attributes: Attributes | None = None) -> None:
        pass


NO_CALLBACKS: FitCallbacks = _NoCallbacks()


def _local(attributes: Attributes) -> Attributes:
    """``attributes`` with ``comm=MPI.COMM_SELF``: the copy's collective methods (``score``) then
    run on rank 0 alone, so a hook that calls them cannot wait for ranks already in the fit's next
    collective. Evaluated by scikit-learn only when a hook asks for ``fitted_estimator``."""

    def local() -> dict[str, Any]:
        from mpi4py import MPI

        return {**attributes(), "comm": MPI.COMM_SELF}

    return local


def fit_callbacks(
    estimator: Any, rank: int, max_subtasks: int, X: Any, sample_weight: Any = None, *, name: str = "fit"
) -> FitCallbacks:
    """Set up the callbacks of ``estimator``'s fit (``setup`` and the fit's ``on_fit_task_begin``)
    on rank 0 when it has any; :data:`NO_CALLBACKS` on every other rank, without callbacks, or
    without ``sklearn.callback``. ``rank`` is this rank in the fit's communicator, ``max_subtasks``
    the fit's subtasks at most (0: none), ``X`` and ``sample_weight`` this rank's rows."""
    if not AVAILABLE or rank != 0 or not getattr(estimator, "_skl_callbacks", None):
        return NO_CALLBACKS
    root = estimator._init_callback_context(task_name=name, max_subtasks=max_subtasks)
    calls = FitCallbacks(estimator, root, X, None if sample_weight is None else {"sample_weight": sample_weight})
    calls.begin(root)
    return calls
