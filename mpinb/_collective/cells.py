"""Where notebook cells begin and end on an IPython engine: the cell every collective belongs to.

Local; no MPI. On an ipyparallel engine, :func:`install` registers IPython's ``pre_execute`` and
``post_execute`` events (engines run cells silently, so ``pre_run_cell``/``post_run_cell`` never
fire). A cell's identity comes from the execute request: ``MPICluster``'s client stamps every
request of one ``execute`` call with one id and the engine ids it goes to
(:mod:`mpinb.client._ipp`); a request from another client gets this engine's own cell count, which
agrees across engines as long as every cell goes to every engine. Outside IPython (``mpiexec
python script.py``) every collective belongs to cell 0 and nothing here runs.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["Cell", "current", "engine_id", "install", "on_cell", "on_idle"]

#: The metadata keys of an execute request that MPICluster's client stamps.
CELL_KEY, TARGETS_KEY = "mpinb_cell", "mpinb_targets"
_COLOURS = re.compile(r"\x1b\[[0-9;]*m")


class Cell:
    """One cell: its id (0: no cell), the engine ids it was sent to (``None``: not known), and
    whether it is ``plumbing``: a function of mpinb's or ipyparallel's own that the client applied
    (``cluster.pull``, ``healthy()``), which the rank panel does not count as the user's cell."""

    __slots__ = ("id", "plumbing", "targets")

    def __init__(self, id: int, targets: tuple[int, ...] | None = None, plumbing: bool = False) -> None:
        self.id, self.targets, self.plumbing = id, targets, plumbing

    def __repr__(self) -> str:
        return f"Cell({self.id}, targets={self.targets})"


_NONE = Cell(0)
_current = _NONE
_count = 0  # cells run here without a stamped id
_listeners: list[Callable[[str, Cell, BaseException | None], None]] = []
_shell: Any = None
_FROM_SHELL: Any = object()  # _end's error: the one the shell's last execution result holds


def current() -> Cell:
    """The cell running now (``Cell(0)`` outside cells)."""
    return _current


def on_cell(listener: Callable[[str, Cell, BaseException | None], None]) -> None:
    """Call ``listener("begin", cell, None)`` and ``listener("end", cell, error)`` around every cell."""
    if listener not in _listeners:
        _listeners.append(listener)


def on_idle(listener: Callable[[], None], every: float) -> bool:
    """Call ``listener()`` every ``every`` seconds while this engine runs no cell; ``False`` outside
    an engine. It runs from the kernel's event loop, on the main thread, so never inside a cell.

    Notes between ranks are passed on by the ranks that receive them (:mod:`.notices`): an engine
    idle between cells would otherwise hold a note back from the ranks after it until its next cell.
    """
    import threading

    loop = getattr(getattr(_shell, "kernel", None), "io_loop", None)
    if loop is None:
        return False

    def tick() -> None:
        if _current is _NONE and threading.current_thread() is threading.main_thread():
            try:
                listener()
            except Exception:  # noqa: BLE001 - the kernel's loop must go on
                pass
        loop.call_later(every, tick)

    loop.call_later(every, tick)
    return True


def engine_id() -> int | None:
    """This engine's ipyparallel id, or ``None`` outside an engine."""
    kernel = getattr(_engine_shell(), "kernel", None)
    value = getattr(kernel, "engine_id", None)
    return value if isinstance(value, int) and value >= 0 else None


def install() -> bool:
    """Watch this engine's cells (idempotent); ``False`` outside an ipyparallel engine."""
    global _shell
    if _shell is not None:
        return True
    shell = _engine_shell()
    if shell is None:
        return False
    shell.events.register("pre_execute", _begin)
    shell.events.register("post_execute", _end)
    shell.ast_transformers.append(EndCheck())
    _run_every_request(shell.kernel)
    _interrupts_say_where()
    _shell = shell
    _applied_functions_are_cells()
    from mpinb._hidden_frames import install as hide_mpinb_frames

    hide_mpinb_frames(shell)  # what a cell shows of an error: the user's frames and the message
    return True


class EndCheck:
    """An IPython AST transformer: the last statement of every cell becomes a call of
    :func:`mpinb._collective.cell_end_check` (around the last expression, whose value it returns, so
    what the cell shows is unchanged). The check runs as part of the cell, so a divergence it finds
    is the cell's error, on every rank -- an error in a ``post_execute`` hook would only be printed."""

    _CALL = "__import__('mpinb._collective', fromlist=['cell_end_check']).cell_end_check()"

    def visit(self, node: Any) -> Any:
        import ast

        if not isinstance(node, ast.Module) or not node.body:
            return node
        call = ast.parse(self._CALL, mode="eval").body
        assert isinstance(call, ast.Call)
        last = node.body[-1]
        if isinstance(last, ast.Expr):
            call.args = [last.value]
            node.body[-1] = ast.copy_location(ast.Expr(call), last)
        else:
            node.body.append(ast.copy_location(ast.Expr(call), last))
        return ast.fix_missing_locations(node)


def describe_error(error: BaseException | None, limit: int = 300) -> str:
    """``"ended normally"`` or ``"raised ZeroDivisionError: division by zero"``: one line, at most
    ``limit`` characters of the message, terminal colours (Keras's) removed."""
    if error is None:
        return "ended normally"
    text = " ".join(_COLOURS.sub("", str(error)).split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return f"raised {type(error).__name__}" + (f": {text}" if text else "")


def _run_every_request(kernel: Any) -> None:
    """Run every execute request this engine is sent, also those queued behind a failed one.

    ipykernel aborts the requests queued behind one that raised (``stop_on_error``): right for one
    notebook's own kernel ("Run all" stops at the first error), wrong for a rank. After the Stop
    button every rank's cell raises, so the blocking cell sent right after it came back at once as
    "aborted" -- no output, no error, never run. And the decision is each engine's own: a rank
    whose cell raised alone skips the next cell while the others run it. The notebook's kernel
    still stops "Run all" at a failed ``%%px`` cell; a queue emptied on purpose
    (``client.abort()``) is untouched."""
    handlers = getattr(kernel, "shell_handlers", None)
    if not isinstance(handlers, dict):
        return
    execute = handlers.get("execute_request")
    if execute is None or getattr(execute, "_mpinb_runs_every_request", False):
        return

    def execute_request(stream: Any, ident: Any, parent: dict[str, Any]) -> Any:
        content = parent.get("content")
        if isinstance(content, dict):
            content["stop_on_error"] = False
        return execute(stream, ident, parent)

    execute_request._mpinb_runs_every_request = True  # type: ignore[attr-defined]
    handlers["execute_request"] = execute_request


def _interrupts_say_where() -> None:
    """Make the Stop button's ``KeyboardInterrupt`` say where this rank was: Python's own has an empty
    message, so after an interrupt of every rank nothing told the user that one rank was in its
    own ``eigh`` while the others waited for it. ipykernel installs ``signal.default_int_handler``
    around every request it handles, looked up in its module: ours raises the same exception,
    with the user's line and the library call it was in. A rank waiting in a collective says which
    one, and for whom (the collective layer words that; see ``Op._wait``)."""
    try:
        from ipykernel import kernelbase
    except ImportError:
        return
    if getattr(kernelbase.default_int_handler, "_mpinb_says_where", False):
        return
    kernelbase.default_int_handler = interrupted  # type: ignore[assignment]  # raises as Python's own does


def interrupted(signum: int, frame: Any) -> None:
    """A SIGINT handler: ``KeyboardInterrupt`` naming this rank and where its main thread was.

    A rank whose cell has already failed has nothing left to stop: while IPython formats that
    error (for ``apply`` requests too) the signal is dropped. Raising there replaced the error that
    said what happened -- "rank 0 gave up on allreduce #3 (was interrupted)", read a moment before
    this rank's own signal came -- by an interrupt "at __init__ (executing.py:138)"."""
    from mpinb import _frames

    if _showing_an_error(frame):
        return
    frames = _frames.frames_of(frame)
    where = _frames.describe(frames, _frames.user_source(frames)) or "an unknown place"
    raise KeyboardInterrupt(f"interrupted{_on_rank()} (the Stop button, cluster.interrupt() or Ctrl-C) "
                            f"at {where}")


interrupted._mpinb_says_where = True  # type: ignore[attr-defined]

# IPython's functions that render an error the request's code already raised.
_RENDERERS = ("showtraceback", "showsyntaxerror")


def _showing_an_error(frame: Any) -> bool:
    while frame is not None:
        if frame.f_code.co_name in _RENDERERS and frame.f_globals.get("__name__", "").startswith("IPython."):
            return True
        frame = frame.f_back
    return False


def _on_rank() -> str:
    try:
        from mpinb._collective.runtime import PROCESS

        mpi = PROCESS.mpi
        return f" on rank {mpi.COMM_WORLD.Get_rank()}" if mpi.Is_initialized() and not mpi.Is_finalized() else ""
    except Exception:  # noqa: BLE001 - a message, not a reason to fail
        return ""


def _applied_functions_are_cells() -> None:
    """Make every function an engine runs for ``view.apply`` (``apply_async``, ``map``) a cell, as
    every ``execute`` is: IPython's ``pre_execute``/``post_execute`` events fire for code only, so a
    function that raised on one rank before a collective left the others waiting until an
    interrupt, and its collectives were no cell's. The function is wrapped where ipyparallel's
    engine unpacks it (its ``do_apply`` calls the module's ``unpack_apply_message``): the cell ends,
    and its collectives are compared, inside the request, so a divergence is the function's error."""
    try:
        from ipyparallel.engine import kernel as engine_kernel
    except ImportError:
        return
    unpack = engine_kernel.unpack_apply_message
    if getattr(unpack, "_mpinb_cells", False):
        return

    def unpack_apply_message(*args: Any, **kwargs: Any) -> Any:
        f, f_args, f_kwargs = unpack(*args, **kwargs)
        return _as_cell(f), f_args, f_kwargs

    unpack_apply_message._mpinb_cells = True  # type: ignore[attr-defined]
    engine_kernel.unpack_apply_message = unpack_apply_message


def _is_plumbing(f: Callable[..., Any]) -> bool:
    """Whether ``f`` is mpinb's or ipyparallel's own (``pull``'s getter, a health probe), not the user's."""
    module = getattr(f, "__module__", None) or ""
    return module.split(".")[0] in ("mpinb", "ipyparallel")


def _as_cell(f: Callable[..., Any]) -> Callable[..., Any]:
    def cell(*args: Any, **kwargs: Any) -> Any:
        if _current is not _NONE:
            return f(*args, **kwargs)  # applied from inside a cell: that cell's
        from mpinb._collective import cell_end_check

        _begin(plumbing=_is_plumbing(f))
        error: BaseException | None = None
        try:
            return cell_end_check(f(*args, **kwargs))
        except BaseException as err:
            error = err
            raise
        finally:
            _end(error)

    cell.__wrapped__ = f  # type: ignore[attr-defined]
    return cell


def _engine_shell() -> Any:
    # An engine has imported IPython long before any mpinb call; importing it here to find out
    # cost a script's first collective 0.25 s.
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    shell = ipython.get_ipython()
    kernel = getattr(shell, "kernel", None)
    return shell if kernel is not None and hasattr(kernel, "engine_id") else None


def _begin(plumbing: bool = False) -> None:
    global _current, _count
    metadata: dict[str, Any] = {}
    kernel: Any = getattr(_shell, "kernel", None)
    try:
        parent = kernel.get_parent()
        metadata = parent.get("metadata") or {}
    except Exception:  # noqa: BLE001 - an older kernel: count cells instead
        pass
    stamped = metadata.get(CELL_KEY)
    if isinstance(stamped, int) and stamped > 0:
        targets = metadata.get(TARGETS_KEY)
        cell = Cell(stamped, tuple(int(t) for t in targets) if isinstance(targets, list) else None, plumbing)
    else:
        _count += 1
        cell = Cell(_count, plumbing=plumbing)
    _current = cell
    for listener in list(_listeners):
        listener("begin", cell, None)


def _end(error: Any = _FROM_SHELL) -> None:
    global _current
    cell = _current
    if cell.id == 0:
        return  # the cell that installed the hooks began before them
    if error is _FROM_SHELL:
        result = getattr(_shell, "last_execution_result", None)
        error = getattr(result, "error_in_exec", None) if result is not None else None
    _current = _NONE
    for listener in list(_listeners):
        listener("end", cell, error)
