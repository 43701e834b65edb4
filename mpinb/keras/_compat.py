"""Every private part of Keras and TensorFlow that mpinb.keras relies on, each with its fallback.

Checked against Keras 3.15.1 and TensorFlow 2.21.0 (the versions this package is tested with).
When a Keras release moves one of these, this module is the one place to mend; each item says why
no public API does the job and what happens when the private part is missing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["alias_exported_name", "built_for", "compile_generation", "in_xla_context", "retrace", "serialise_as",
           "set_steps_per_execution", "traced_step", "use_traced_step"]


def retrace(model: Any) -> None:
    """Make the next ``fit`` trace a new train step.

    Private: ``model.train_function`` (Keras 3.15.1, TensorFlow backend) caches the traced step, and
    ``make_train_function`` rebuilds it only when the cache is ``None``; no public call drops it.
    Needed after swapping in a DistributedOptimizer, turning XLA off, or changing the steps per
    execution or the accumulation: the cached step would still run the old settings. Fallback: none
    needed, setting an attribute Keras no longer reads is harmless (``compile`` again would be the
    public way, at the price of losing compiled metrics' state).
    """
    model.train_function = None


def traced_step(model: Any) -> Any:
    """The train step Keras traced for the next ``fit`` (``None``: it will trace one).

    Private: ``model.train_function`` (Keras 3.15.1), as in :func:`retrace`. mpinb.keras.fit keeps it
    from one fit to the next (:mod:`mpinb.keras._step`). Fallback: ``None``, so every fit traces.
    """
    return getattr(model, "train_function", None)


def use_traced_step(model: Any, function: Any) -> None:
    """Make the next ``fit`` run ``function``, a step :func:`traced_step` returned earlier (see there)."""
    model.train_function = function


def compile_generation(model: Any) -> Any:
    """An object that ``model.compile`` replaces on every call, or ``None`` if there is none.

    Private: Keras 3.15.1 makes a new ``_compile_config`` in every ``compile``; a train step traced
    before a ``compile`` may run another loss, metrics or optimizer. Fallback, if it moves: ``None``,
    and mpinb.keras.fit traces every fit's step afresh, as before it kept them.
    """
    return getattr(model, "_compile_config", None)


def set_steps_per_execution(model: Any, steps: int) -> None:
    """Run ``steps`` steps per execution from the next ``fit`` on.

    Private: ``compile(steps_per_execution=N)`` is public, but changing it afterwards means assigning
    the attribute ``compile`` sets (Keras 3.15.1), then :func:`retrace`. fit lowers it for one call,
    so that epochs end on execution boundaries, and puts the user's value back.
    """
    model.steps_per_execution = steps
    retrace(model)


def built_for(optimizer: Any) -> list[Any]:
    """The model variables a built ``optimizer`` was built for, to build its wrapper for the same.

    Private: ``build(variables)`` is public but nothing public gives the list back; Keras 3.15.1
    keeps it in ``_trainable_variables``. Fallback, if that moves: a clear error asking for the
    optimizer to be wrapped before it is built, when there is no state to copy.
    """
    variables = getattr(optimizer, "_trainable_variables", None)
    if variables is None:
        raise RuntimeError(
            f"DistributedOptimizer cannot copy the state of an already built {type(optimizer).__name__} "
            "with this Keras version; wrap the optimizer before training, e.g. "
            "model.compile(optimizer=DistributedOptimizer(keras.optimizers.Adam(1e-3)), ...)."
        )
    return list(variables)


def serialise_as(base: type, cls: type) -> None:
    """Make Keras serialise ``cls`` exactly as ``base``, while loading still gives ``base``.

    Keras writes a class under a custom name given by ``keras.saving.register_keras_serializable``
    ("package>Name"), under the exported API name for its own classes ("keras.optimizers" /
    "SGD"), or else under its module and class name, which ``cls`` already shares with ``base``.

    Relies on an implementation detail: ``keras.saving.get_custom_objects()`` returns Keras's live
    name -> class dict (Keras 3.15.1), which is how registering only the class -> name direction is
    undone. Fallback: if it were a copy, the name would load ``cls`` in this process only (a
    subclass of ``base`` that trains exactly like it on one rank).
    """
    import keras

    name = keras.saving.get_registered_name(base)  # the bare class name when not registered
    if ">" in name:
        package, _, short = name.partition(">")
        # Registering writes both directions: cls -> name (wanted: the wrapper saves under base's
        # name) and name -> cls (not wanted: a reloaded model must get the plain base, which has no
        # MPI exchange). Put the name -> class entry back.
        objects = keras.saving.get_custom_objects()
        previous = objects.get(name)
        keras.saving.register_keras_serializable(package, short)(cls)
        if previous is None:
            objects.pop(name, None)
        else:
            objects[name] = previous
    alias_exported_name(base, cls)


def alias_exported_name(base: type, cls: type) -> None:
    """Give ``cls`` the exported API name of ``base`` (``keras.optimizers.SGD``), if it has one.

    Private: Keras 3.15.1 looks the exported name up by class object in
    ``keras.src.api_export.REGISTERED_OBJS_TO_NAMES``, which no public function sets. Only the
    class -> name direction is written, so loading that name still gives ``base``. Fallback, if the
    registry moves: ``cls`` is written under ``base``'s module path
    (``keras.src.optimizers.sgd.SGD``), which plain Keras also loads as ``base``.
    """
    try:
        from keras.src import api_export

        names = api_export.REGISTERED_OBJS_TO_NAMES
    except (ImportError, AttributeError):
        return
    if isinstance(names, dict) and base in names:
        names[cls] = names[base]


def in_xla_context() -> bool:
    """Whether the step being traced is XLA-compiled (``jit_compile=True``).

    Private TensorFlow API (``tensorflow.python.ops.control_flow_util``, TensorFlow 2.21.0): there is
    no public test for it. Needed to refuse XLA with a message that says what to do, instead of
    XLA's own "tf2xla conversion failed ... PyFunc". Fallback, if the helper moves: ``False``, so
    there is no early check and XLA itself refuses the Python call.
    """
    try:
        import tensorflow as tf
        from tensorflow.python.ops import control_flow_util

        return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))
    except Exception:  # noqa: BLE001 - a missing private helper just means no early check
        return False
