"""mpinb.keras in one process: the optimizer wrapper's identity, saving, XLA handling, history, errors."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import weakref

import numpy as np
import pytest

keras = pytest.importorskip("keras")
mk = pytest.importorskip("mpinb.keras")

from mpi4py import MPI  # noqa: E402

from mpinb._training import exchange  # noqa: E402
from support.counting import count_calls  # noqa: E402

SELF = MPI.COMM_SELF
LOSS = "sparse_categorical_crossentropy"


def data(n=256, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 16)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64) + 2 * (X[:, 1] > 0)
    return X, y


@keras.saving.register_keras_serializable("mpinb_tests")
class RegisteredSGD(keras.optimizers.SGD):
    """A user's own optimizer, saved under its registered name "mpinb_tests>RegisteredSGD"."""


def mlp(optimizer=None, seed=0, **compile_kwargs):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [keras.Input((16,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(4, activation="softmax")]
    )
    model.compile(optimizer=optimizer or keras.optimizers.SGD(0.1, momentum=0.9), loss=LOSS, metrics=["accuracy"],
                  **compile_kwargs)
    return model


def test_import_mpinb_does_not_import_keras_or_tensorflow():
    code = "import sys, mpinb; assert not {'keras', 'tensorflow', 'mpi4py.MPI'} & set(sys.modules), sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_public_api_is_sorted_and_lazy():
    import mpinb

    assert mk.__all__ == sorted(mk.__all__)
    assert mpinb.keras is mk
    for name in mk.__all__:
        assert hasattr(mk, name)


@pytest.mark.parametrize("make", [lambda: keras.optimizers.SGD(0.1, momentum=0.9), lambda: keras.optimizers.Adam(1e-3),
                                  lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))],
                         ids=["sgd", "adam", "loss_scale"])
def test_wrapper_keeps_class_name_module_and_config(make):
    plain = make()
    wrapped = mk.DistributedOptimizer(plain, comm=SELF)
    assert type(wrapped).__name__ == type(plain).__name__
    assert type(wrapped).__module__ == type(plain).__module__
    assert isinstance(wrapped, type(plain)) and type(wrapped) is not type(plain)
    assert mk.is_distributed(wrapped) and not mk.is_distributed(plain)
    assert keras.saving.serialize_keras_object(wrapped) == keras.saving.serialize_keras_object(plain)
    assert type(mk.DistributedOptimizer(make(), comm=SELF)) is type(wrapped)  # one subclass per class
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(wrapped))
    assert type(restored) is type(plain) and restored.get_config() == plain.get_config()


@pytest.mark.parametrize("cls", [keras.optimizers.SGD, RegisteredSGD], ids=["exported", "registered"])
def test_saved_wrapper_reloads_as_the_plain_class_in_the_same_process(tmp_path, cls):
    X, y = data()
    plain = cls(0.1, momentum=0.9)
    wrapped = mk.DistributedOptimizer(plain, comm=SELF)
    name = keras.saving.get_registered_name(cls)
    assert keras.saving.get_registered_name(type(wrapped)) == name
    assert keras.saving.get_registered_object(name) in (None, cls)  # the name still loads the plain class
    assert keras.optimizers.serialize(wrapped) == keras.optimizers.serialize(plain)
    model = mlp(wrapped)
    model.fit(X, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert type(loaded.optimizer) is cls and not mk.is_distributed(loaded.optimizer)
    assert int(loaded.optimizer.iterations.numpy()) == 256 // 32
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_without_keras_private_export_registry_a_saved_wrapper_still_reloads_plain(monkeypatch):
    from mpinb.keras import _compat, optimizer

    # A Keras whose private export registry moved: the wrapper is written under its module path.
    monkeypatch.setattr(optimizer, "_CLASSES", {})
    monkeypatch.setattr(_compat, "alias_exported_name", lambda base, cls: None)
    wrapped = mk.DistributedOptimizer(keras.optimizers.Adam(1e-3), comm=SELF)
    config = keras.optimizers.serialize(wrapped)
    assert config["module"] == keras.optimizers.Adam.__module__ and config["class_name"] == "Adam"
    restored = keras.optimizers.deserialize(config)
    assert type(restored) is keras.optimizers.Adam and restored.get_config() == wrapped.get_config()


def test_wrapper_rejects_bad_input():
    with pytest.raises(TypeError, match="wraps a Keras 3 optimizer instance"):
        mk.DistributedOptimizer(keras.optimizers.SGD)
    with pytest.raises(TypeError, match="wraps a Keras 3 optimizer instance"):
        mk.DistributedOptimizer("sgd")
    wrapped = mk.DistributedOptimizer(keras.optimizers.SGD(0.1), comm=SELF)
    with pytest.raises(ValueError, match="already a DistributedOptimizer"):
        mk.DistributedOptimizer(wrapped)
    with pytest.raises(ValueError, match="Wrap the LossScaleOptimizer, not its inner optimizer"):
        mk.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(wrapped))


def test_wrapping_a_built_optimizer_keeps_its_state_and_trains_on():
    X, y = data()
    a, b = mlp(keras.optimizers.Adam(0.01)), mlp(keras.optimizers.Adam(0.01))
    for model in (a, b):
        model.fit(X, y, epochs=1, batch_size=32, shuffle=False, verbose=0)
    wrapped = mk.DistributedOptimizer(b.optimizer, comm=SELF)
    assert wrapped.built
    for mine, theirs in zip(wrapped.variables, b.optimizer.variables, strict=True):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    # Built for the model's own variables, so training goes on from the copied moments exactly.
    a.compile(optimizer=a.optimizer, loss=LOSS, metrics=["accuracy"])
    b.compile(optimizer=wrapped, loss=LOSS, metrics=["accuracy"])
    for model in (a, b):
        model.fit(X, y, epochs=1, batch_size=32, shuffle=False, verbose=0)
    assert int(wrapped.iterations.numpy()) == 2 * (256 // 32)
    for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_array_equal(wa, wb)


def test_wrapping_a_built_optimizer_without_keras_private_variable_list_says_wrap_first(monkeypatch):
    X, y = data()
    model = mlp(keras.optimizers.SGD(0.1))
    model.fit(X, y, epochs=1, batch_size=64, verbose=0)
    monkeypatch.delattr(model.optimizer, "_trainable_variables")  # a Keras that keeps it elsewhere
    with pytest.raises(RuntimeError, match="wrap the optimizer before training"):
        mk.DistributedOptimizer(model.optimizer, comm=SELF)


def test_one_rank_distributed_training_equals_plain_keras(monkeypatch):
    X, y = data()
    exchanges = count_calls(monkeypatch, exchange, "sum_over_ranks")
    a = mlp(keras.optimizers.Adam(0.01))
    b = mlp(mk.DistributedOptimizer(keras.optimizers.Adam(0.01), comm=SELF))
    a.fit(X, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    b.fit(X, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_array_equal(wa, wb)
    assert len(exchanges) == 0  # one rank: the hook steps aside entirely


def test_saved_model_loads_in_plain_keras_without_mpinb(tmp_path):
    X, y = data()
    model = mlp(keras.optimizers.SGD(0.1, momentum=0.9))
    mk.fit(model, X, y, batch_size=32, epochs=2, checkpoint=tmp_path / "m.keras", verbose=0, comm=SELF)
    assert mk.is_distributed(model.optimizer)
    expected = model.predict(X[:8], verbose=0)
    np.save(tmp_path / "x.npy", X[:8])
    script = textwrap.dedent(
        f"""
        import sys, json, numpy as np, keras
        m = keras.models.load_model({str(tmp_path / "m.keras")!r})
        np.save({str(tmp_path / "pred.npy")!r}, m.predict(np.load({str(tmp_path / "x.npy")!r}), verbose=0))
        print(json.dumps({{"cls": type(m.optimizer).__module__ + "." + type(m.optimizer).__name__,
                          "iterations": int(m.optimizer.iterations.numpy()),
                          "mpinb_loaded": any(k.startswith("mpinb") for k in sys.modules)}}))
        """
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env,
                         cwd=tmp_path, check=True)
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info == {"cls": "keras.src.optimizers.sgd.SGD", "iterations": 2 * (256 // 32), "mpinb_loaded": False}
    np.testing.assert_allclose(np.load(tmp_path / "pred.npy"), expected, rtol=1e-6)
    assert json.loads((tmp_path / "m.keras.json").read_text())["epoch"] == 1


def test_jit_compile_is_refused_in_plain_fit_and_turned_off_by_mpinb_fit():
    X, y = data()
    model = mlp(mk.DistributedOptimizer(keras.optimizers.SGD(0.1), comm=SELF), jit_compile=True)
    with pytest.raises(RuntimeError, match="Compile the model with jit_compile=False"):
        model.fit(X, y, batch_size=32, epochs=1, verbose=0)
    model = mlp(keras.optimizers.SGD(0.1), jit_compile=True)
    assert model.jit_compile
    with pytest.warns(RuntimeWarning, match="turned jit_compile off"):
        history = mk.fit(model, X, y, batch_size=32, epochs=1, verbose=0, comm=SELF)
    assert model.jit_compile is False
    assert np.isfinite(history["loss"][0])


def test_history_structure_and_callbacks_see_global_logs():
    X, y = data()
    seen = []

    class Record(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(dict(logs))

    history = mk.fit(mlp(), X, y, batch_size=64, epochs=3, validation_data=(X[:50], y[:50]), callbacks=[Record()],
                     verbose=0, comm=SELF)
    json.dumps(history)  # plain Python numbers and lists only: pullable to the notebook client
    assert history["epoch"] == [0, 1, 2]
    for key in ("loss", "accuracy", "val_loss", "val_accuracy", "steps"):
        assert len(history[key]) == 3, key
    assert np.array(history["rank_loss"]).shape == (3, 1)
    assert np.array(history["compute_seconds"]).shape == (3, 1)
    assert np.array(history["comm_seconds"]).shape == (3, 1)
    assert all(c >= 0 for row in history["comm_seconds"] for c in row)
    assert all(0 <= w <= c for ws, cs in zip(history["wait_seconds"], history["comm_seconds"], strict=True)
               for w, c in zip(ws, cs, strict=True))
    assert history["params"]["steps_per_epoch"] == 4 and history["params"]["per_rank_batch"] == 64
    assert [s["val_loss"] for s in seen] == history["val_loss"]
    assert [s["loss"] for s in seen] == history["loss"]


def test_learning_rate_warmup_ramps_linearly():
    X, y = data()
    rates = []

    class Watch(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            rates.append(float(np.asarray(self.model.optimizer.learning_rate)))

    model = mlp(keras.optimizers.SGD(0.4))
    warm = mk.LearningRateWarmup(2, start_factor=0.25, comm=SELF)
    mk.fit(model, X, y, batch_size=64, epochs=3, callbacks=[warm, Watch()], verbose=0, comm=SELF)
    np.testing.assert_allclose(rates[0], 0.1, rtol=1e-6)
    assert all(b > a for a, b in zip(rates[:8], rates[1:8], strict=False))
    np.testing.assert_allclose(rates[8:], 0.4, rtol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_size": 0}, ValueError, "batch_size must be a positive integer"),
        ({"batch_size": 2.5}, TypeError, "batch_size must be a positive integer"),
        ({"batch_size": 32, "strategy": "both"}, ValueError, "strategy must be 'gradients' or 'weights'"),
        ({"batch_size": 32, "average_every": 0}, ValueError, "average_every must be a positive integer"),
        ({"batch_size": 32, "resume": True}, ValueError, "resume=True needs checkpoint"),
        ({"batch_size": 32, "epochs": -1}, ValueError, "epochs must be a non-negative integer"),
        ({"batch_size": 32, "callbacks": ["x"]}, TypeError, "callbacks must be keras.callbacks.Callback"),
        ({"batch_size": 512, "shards": "equal"}, ValueError, "fewer than one per-rank batch of 512"),
        ({"batch_size": 32, "shards": "rows"}, ValueError, "shards must be 'proportional' or 'equal'"),
    ],
)
def test_fit_argument_errors(kwargs, error, match):
    X, y = data()
    with pytest.raises(error, match=match):
        mk.fit(mlp(), X, y, verbose=0, comm=SELF, **kwargs)


def test_fit_data_and_model_errors():
    X, y = data()
    with pytest.raises(ValueError, match=r"x and y must have the same number of rows; got 256 and 255"):
        mk.fit(mlp(), X, y[:-1], batch_size=32, comm=SELF)
    bad = X.copy()
    bad[3, 2] = np.nan
    with pytest.raises(ValueError, match="x contains NaN or infinity"):
        mk.fit(mlp(), bad, y, batch_size=32, comm=SELF)
    uncompiled = keras.Sequential([keras.Input((16,)), keras.layers.Dense(4)])
    with pytest.raises(ValueError, match="not compiled"):
        mk.fit(uncompiled, X, y, batch_size=32, comm=SELF)
    with pytest.raises(ValueError, match="must not also average gradients"):
        mk.fit(mlp(mk.DistributedOptimizer(keras.optimizers.SGD(0.1), comm=SELF)), X, y, batch_size=32,
               strategy="weights", comm=SELF)
    with pytest.raises(ValueError, match="must end in .keras"):
        mk.RootCheckpoint("model.h5")


def test_evaluate_matches_keras_and_rejects_no_rows():
    X, y = data()
    model = mlp()
    model.fit(X, y, batch_size=32, epochs=1, verbose=0)
    ours = mk.evaluate(model, X, y, batch_size=7, comm=SELF)
    theirs = model.evaluate(X, y, batch_size=64, verbose=0, return_dict=True)
    assert list(ours) == sorted(theirs)
    for k in theirs:
        np.testing.assert_allclose(ours[k], theirs[k], rtol=1e-6)
    with pytest.raises(ValueError, match="no rows on any rank"):
        mk.evaluate(model, X[:0], y[:0], comm=SELF)


def test_the_training_pipeline_starts_no_autotuning_thread():
    """tf.data's autotuning thread can outlive a fit that raised (its iterator kept alive by the
    exception's traceback), and deleting the iterator then waits out the thread's period, up to
    60 s, inside a garbage collection on one rank while the others wait. mpinb's own pipeline has
    nothing to tune, so it turns tuning off -- and still yields every row of each epoch once."""
    from mpinb._training.plan import BatchPlan
    from mpinb.keras._arrays import dataset

    x, y = np.arange(12, dtype=np.float32).reshape(6, 2), np.arange(6, dtype=np.float32)
    ds = dataset(x, y, 6, BatchPlan(steps=3, per_rank=2, counts=(6,)), 0, 2, seed=0, rank=0, shuffle=True)
    assert ds.options().autotune.enabled is False
    batches = list(ds.as_numpy_iterator())
    assert [len(b[1]) for b in batches] == [2] * 6
    for epoch in (batches[:3], batches[3:]):
        rows = np.concatenate([b[1] for b in epoch])
        assert sorted(rows.tolist()) == list(range(6))
        np.testing.assert_array_equal(np.concatenate([b[0] for b in epoch]), x[rows.astype(int)])


def test_a_scipy_sparse_matrix_trains_like_its_dense_rows():
    sparse = pytest.importorskip("scipy.sparse")
    X, y = data()
    X = np.where(X > 0.5, X, 0).astype(np.float32)
    a, b = mlp(keras.optimizers.SGD(0.1)), mlp(keras.optimizers.SGD(0.1))
    b.set_weights(a.get_weights())
    ha = mk.fit(a, sparse.csr_matrix(X), y, batch_size=64, epochs=2, shuffle=False, verbose=0, comm=SELF)
    hb = mk.fit(b, X, y, batch_size=64, epochs=2, shuffle=False, verbose=0, comm=SELF)
    for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_allclose(wa, wb, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ha["loss"], hb["loss"], rtol=1e-5)
    assert ha["rows_used"] == [[len(X)], [len(X)]]
    scores = mk.evaluate(a, sparse.csr_matrix(X), y, comm=SELF)
    np.testing.assert_allclose(scores["loss"], a.evaluate(X, y, verbose=0, return_dict=True)["loss"], rtol=1e-5)


@pytest.mark.parametrize("kind", ["tf.data", "PyDataset", "generator"])
def test_evaluate_and_validation_take_pipelines(kind):
    import tensorflow as tf

    X, y = data()
    model = mlp()
    model.fit(X, y, batch_size=32, epochs=1, verbose=0)

    class Rows(keras.utils.PyDataset):
        def __len__(self):
            return -(-len(X) // 24)

        def __getitem__(self, i):
            return X[i * 24:(i + 1) * 24], y[i * 24:(i + 1) * 24]

    def make():
        if kind == "tf.data":
            return tf.data.Dataset.from_tensor_slices((X, y)).batch(24), None
        if kind == "PyDataset":
            return Rows(), None
        return ((X[i:i + 24], y[i:i + 24]) for _ in range(9) for i in range(0, len(X), 24)), -(-len(X) // 24)

    theirs = model.evaluate(X, y, batch_size=64, verbose=0, return_dict=True)
    data_, steps = make()
    ours = mk.evaluate(model, data_, steps=steps, comm=SELF)
    for k in theirs:
        np.testing.assert_allclose(ours[k], theirs[k], rtol=1e-6)
    history = mk.fit(model, X, y, batch_size=64, epochs=2, validation_data=make()[0], validation_steps=steps,
                     verbose=0, comm=SELF)
    assert len(history["val_loss"]) == 2


def test_pipeline_arguments_for_validation_and_evaluate_are_checked():
    X, y = data()
    model = mlp()
    with pytest.raises(ValueError, match="would be used up by the first epoch; pass validation_steps="):
        mk.fit(model, X, y, batch_size=64, validation_data=((X, y) for _ in range(3)), verbose=0, comm=SELF)
    with pytest.raises(ValueError, match="y must be None when x is a generator"):
        mk.evaluate(model, ((X, y) for _ in range(3)), y, comm=SELF)


def test_a_refit_reuses_the_last_fits_trace_and_trains_exactly_as_a_fresh_trace(monkeypatch):
    """fit traces its wrapped train step once per model: the next fit of the same model reuses
    it (no new trace), unless something the trace depends on changed (here: accumulation, then
    compile again), and trains bit for bit as a freshly traced step would."""
    from mpinb.keras import _step

    installs = []
    install = _step.StepRows.install
    monkeypatch.setattr(_step.StepRows, "install", lambda self, *a, **k: (installs.append(1), install(self, *a, **k)))
    X, y = data(250)  # an uneven last batch: two input shapes traced
    kept, fresh = mlp(seed=3), mlp(seed=3)
    for model, forget in ((kept, False), (fresh, True)):
        for epochs in (1, 2):
            if forget:
                vars(model).pop(_step.KEPT, None)
            mk.fit(model, X, y, batch_size=32, epochs=epochs, seed=1, verbose=0, comm=SELF)
    assert len(installs) == 1 + 2  # kept: one trace for both fits; fresh: one per fit
    for a, b in zip(kept.get_weights(), fresh.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)

    mk.fit(kept, X, y, batch_size=32, epochs=1, accumulate_steps=2, verbose=0, comm=SELF)
    assert len(installs) == 4, "accumulating micro-steps (another step) must trace again"
    kept.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
    mk.fit(kept, X, y, batch_size=32, epochs=1, verbose=0, comm=SELF)
    assert len(installs) == 5, "a model compiled again must trace again"
    assert "train_step" not in vars(kept), "after fit the model has its own train step back"
    gone = weakref.ref(kept)
    del kept, model
    gc.collect()
    assert gone() is None, "a kept trace must not keep its model alive"
