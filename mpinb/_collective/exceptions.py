"""How an exception crosses ranks: as its type's module and qualified name and its message, never
pickled, and rebuilt as the same type on every rank only where every rank can import it by name."""

from __future__ import annotations

from typing import Any

__all__ = ["agreed", "rebuild", "record"]


def record(error: BaseException) -> tuple[str, str, str]:
    """How an exception crosses ranks: its type's module and qualified name, and its message."""
    kind = type(error)
    return kind.__module__, kind.__qualname__, str(error)


def _find_type(module: str, qualname: str) -> type[BaseException] | None:
    if "<" in qualname:  # defined inside a function: no name reaches it
        return None
    import importlib

    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except Exception:  # noqa: BLE001 - any failure means: not importable by name
        return None
    return found if isinstance(found, type) and issubclass(found, BaseException) else None


def rebuild(kind: type[BaseException] | None, module: str, qualname: str, message: str) -> BaseException:
    # A type that cannot be rebuilt from a message alone (rare) degrades to RuntimeError too.
    if kind is not None:
        try:
            return kind(message)
        except Exception:  # noqa: BLE001
            pass
    name = qualname if module == "builtins" else f"{module}.{qualname}"
    return RuntimeError(f"{name}: {message}")


def agreed(op: Any, module: str, qualname: str, message: str) -> BaseException:
    """The exception every rank raises for a type known by ``module`` and ``qualname``.

    Collective, inside operation ``op``: the type is used only if every rank can import it by that
    name and build it from a message, else every rank gets ``RuntimeError`` naming the type.
    """
    kind = _find_type(module, qualname)
    if not all(op.allgather(kind is not None)):
        kind = None
    return rebuild(kind, module, qualname, message)
