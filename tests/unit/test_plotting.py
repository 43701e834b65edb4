"""One-process tests of mpinb.client.plotting on the Agg backend: what each plot draws, and its error messages."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import to_rgba

from mpinb.client import plotting
from mpinb.client.plotting import (
    plot_clusters,
    plot_inertia,
    plot_loss,
    plot_speedup,
    plot_timing,
)

# Three epochs, four ranks: each rank's loss is the global one plus a rank-specific offset.
LOSS = [2.0, 1.25, 0.75]
VAL = [2.5, 1.5, 1.0]
RANK_LOSS = [[v + 0.1 * r for r in range(4)] for v in LOSS]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _lines(ax) -> dict[str, object]:
    return {line.get_label(): line for line in ax.get_lines()}


def _blobs(n_per: list[int], d: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=8.0, size=(len(n_per), d))
    X = np.concatenate([m + rng.normal(size=(n, d)) for m, n in zip(means, n_per, strict=True)])
    labels = np.repeat(np.arange(len(n_per)), n_per)
    centers = np.stack([X[labels == c].mean(axis=0) for c in range(len(n_per))])
    return X, labels, centers


# --------------------------------------------------------------------------------------------------
# plot_loss


def _fit_history(epochs: int, ranks: int) -> dict:
    """A history laid out as mpinb.keras.fit returns it (a resumed run: epochs 2, 3, ...)."""
    rng = np.random.default_rng(3)
    return {
        "epoch": list(range(2, 2 + epochs)),
        "steps": [10] * epochs,
        "loss": LOSS[:epochs],
        "val_loss": VAL[:epochs],
        "rank_loss": [[v + 0.1 * r for r in range(ranks)] for v in LOSS[:epochs]],
        "compute_seconds": rng.uniform(1, 2, (epochs, ranks)).round(3).tolist(),
        "comm_seconds": rng.uniform(0.1, 0.5, (epochs, ranks)).round(3).tolist(),
        "wait_seconds": rng.uniform(0.0, 0.1, (epochs, ranks)).round(3).tolist(),
        "params": {"batch_size": 64, "ranks": ranks},
    }


def test_plot_loss_draws_history_values_and_one_line_per_rank() -> None:
    ax = plot_loss({"loss": LOSS, "val_loss": VAL, "rank_loss": RANK_LOSS})
    lines = _lines(ax)
    assert sorted(lines) == ["rank 0", "rank 1", "rank 2", "rank 3", "train", "validation"]
    np.testing.assert_array_equal(lines["train"].get_xdata(), [1, 2, 3])
    np.testing.assert_array_equal(lines["train"].get_ydata(), LOSS)
    np.testing.assert_array_equal(lines["validation"].get_ydata(), VAL)
    for r in range(4):
        rank = lines[f"rank {r}"]
        np.testing.assert_array_equal(rank.get_xdata(), [1, 2, 3])
        np.testing.assert_allclose(rank.get_ydata(), [v + 0.1 * r for v in LOSS])
    assert ax.get_xlabel() == "epoch" and ax.get_ylabel() == "loss"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["train", "validation", "rank 0", "rank 1", "rank 2", "rank 3"]


def test_plot_loss_rank_lines_are_visible_distinct_and_under_the_global_lines() -> None:
    lines = _lines(plot_loss(_fit_history(3, 4)))
    ranks = [lines[f"rank {r}"] for r in range(4)]
    train, val = lines["train"], lines["validation"]
    rgb = [to_rgba(line.get_color())[:3] for line in ranks]
    assert len(np.unique(np.round(rgb, 6), axis=0)) == 4, "each rank needs its own colour"
    assert to_rgba(train.get_color()) == to_rgba(val.get_color()) == (0.0, 0.0, 0.0, 1.0)
    assert all(c != (0.0, 0.0, 0.0) for c in rgb), "a rank must not share the global curves' black"
    for line in ranks:
        assert line.get_alpha() >= 0.6
        assert 1.0 <= line.get_linewidth() < train.get_linewidth()
        assert line.get_zorder() < min(train.get_zorder(), val.get_zorder())
    assert train.get_alpha() in (None, 1.0) and val.get_linestyle() == "--"


def test_plot_loss_many_ranks_get_distinct_colours_and_one_legend_entry() -> None:
    h = {"loss": LOSS, "rank_loss": [[v + 0.01 * r for r in range(16)] for v in LOSS]}
    ax = plot_loss(h)
    ranks = [line for line in ax.get_lines() if line.get_label().startswith("rank ")]
    assert len(ranks) == 16
    rgb = [to_rgba(line.get_color())[:3] for line in ranks]
    assert len(np.unique(np.round(rgb, 6), axis=0)) == 16
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["train", "ranks 0-15 (one colour each)"]


def test_plot_loss_reads_the_fit_history_layout() -> None:
    h = _fit_history(3, 2)
    lines = _lines(plot_loss(h))
    assert sorted(lines) == ["rank 0", "rank 1", "train", "validation"]
    np.testing.assert_array_equal(lines["train"].get_xdata(), [3, 4, 5])  # history["epoch"] + 1
    np.testing.assert_array_equal(lines["rank 1"].get_xdata(), [3, 4, 5])
    np.testing.assert_allclose(lines["rank 1"].get_ydata(), np.add(LOSS, 0.1))


def test_plot_loss_reads_a_keras_history_object() -> None:
    # keras.callbacks.History keeps the logs in .history (no per-rank values); fit's own
    # exceptions carry the history up to the stop the same way.
    history = SimpleNamespace(history={"loss": LOSS, "accuracy": [0.5, 0.6, 0.7]}, epoch=[0, 1, 2])
    lines = _lines(plot_loss(history))
    assert sorted(lines) == ["train"]
    np.testing.assert_array_equal(lines["train"].get_ydata(), LOSS)
    ax = plot_loss(history, metric="accuracy")
    np.testing.assert_array_equal(_lines(ax)["train"].get_ydata(), [0.5, 0.6, 0.7])
    assert ax.get_ylabel() == "accuracy"


def test_plot_loss_draws_any_metric_per_rank_and_names_the_logged_ones() -> None:
    accuracy = [[0.5 + 0.1 * e + 0.01 * r for r in range(3)] for e in range(3)]
    history = {"epoch": [0, 1, 2], "steps": [4, 4, 4], "loss": LOSS, "accuracy": [0.6, 0.7, 0.8],
               "val_accuracy": [0.55, 0.65, 0.75], "rank_loss": RANK_LOSS, "rank_accuracy": accuracy}
    lines = _lines(plot_loss(history, "accuracy"))
    assert sorted(lines) == ["rank 0", "rank 1", "rank 2", "train", "validation"]
    np.testing.assert_array_equal(lines["rank 2"].get_ydata(), np.asarray(accuracy)[:, 2])
    with pytest.raises(ValueError, match=r"'auc' was not logged; the metrics logged are \['accuracy', 'loss'\]"):
        plot_loss(history, "auc")


def test_plot_loss_per_rank_false_and_given_axes() -> None:
    fig, ax = plt.subplots()
    ax.plot([0, 1], [5, 5], label="already there")
    out = plot_loss({"loss": LOSS, "rank_loss": RANK_LOSS}, ax=ax, per_rank=False)
    assert out is ax and len(fig.axes) == 1
    assert sorted(_lines(ax)) == ["already there", "train"]


def test_plot_loss_tolerates_fit_history_without_rank_loss() -> None:
    h = _fit_history(3, 2) | {"rank_loss": []}
    assert sorted(_lines(plot_loss(h))) == ["train", "validation"]


@pytest.mark.parametrize(
    ("history", "kwargs", "exc", "match"),
    [
        (
            {"loss": LOSS},
            {"metric": "accuracy"},
            ValueError,
            r"no 'accuracy' or 'val_accuracy' values; its keys are \['loss'\]",
        ),
        ({"rank_loss": RANK_LOSS}, {}, ValueError, r"no 'loss' or 'val_loss' values"),
        (
            [1.0, 2.0],
            {},
            TypeError,
            r"what mpinb\.keras\.fit returns .* or a keras\.callbacks\.History .*; got list",
        ),
        ("loss", {}, TypeError, "got str"),
        ([{"loss": 0.9}, {"loss": 0.7}], {}, TypeError, "got list"),  # per-epoch dicts: not a fit layout
        (SimpleNamespace(history=[0.9, 0.7]), {}, TypeError, "got SimpleNamespace"),
        (
            {"loss": [[1, 2], [3, 4]]},
            {},
            ValueError,
            r"history\['loss'\] must be one number per epoch; got .* shape \(2, 2\)",
        ),
        (
            {"loss": LOSS, "rank_loss": LOSS},
            {},
            ValueError,
            r"history\['rank_loss'\] must be an epochs x ranks table",
        ),
        (
            {"loss": LOSS, "rank_loss": [[1, 2], [3]]},
            {},
            ValueError,
            r"history\['rank_loss'\] must be an epochs x ranks",
        ),
        (  # ranks x epochs is not what fit records, and is not guessed at
            {"loss": LOSS, "rank_loss": np.asarray(RANK_LOSS).T},
            {},
            ValueError,
            r"history\['rank_loss'\] must have one row per epoch \(3\).*got shape \(4, 3\)",
        ),
        ({"loss": []}, {}, ValueError, r"must be one number per epoch; got an array of shape \(0,\)"),
        ({"loss": LOSS}, {"metric": 3}, TypeError, "metric must be a string"),
    ],
)
def test_plot_loss_rejects_malformed_history(history, kwargs, exc, match) -> None:
    with pytest.raises(exc, match=match):
        plot_loss(history, **kwargs)
    assert plt.get_fignums() == []  # checked before drawing: no stray empty figure


# --------------------------------------------------------------------------------------------------
# plot_clusters


def _rgba(collection) -> np.ndarray:
    return np.asarray(collection.get_facecolors())


def test_plot_clusters_one_distinct_colour_per_cluster_and_centres_in_place() -> None:
    X, labels, centers = _blobs([40, 50, 60], d=2)
    ax = plot_clusters(X, labels, centers)
    clusters, marks = ax.collections[:3], ax.collections[3]
    assert len(ax.collections) == 4
    colours = []
    for c, coll in enumerate(clusters):
        np.testing.assert_array_equal(coll.get_offsets(), X[labels == c])
        face = _rgba(coll)
        assert len(np.unique(face.round(6), axis=0)) == 1, "a cluster must be drawn in one colour"
        colours.append(face[0, :3])
    assert len(np.unique(np.round(colours, 6), axis=0)) == 3, "clusters must get distinct colours"
    np.testing.assert_allclose(marks.get_offsets(), centers)
    np.testing.assert_allclose(_rgba(marks)[:, :3], colours)  # centre c has cluster c's colour
    assert (np.asarray(marks.get_edgecolors())[:, :3] == 0).all()  # black edges
    assert marks.get_sizes()[0] > clusters[0].get_sizes()[0]
    assert ax.get_title() == "N = 150, k = 3"
    assert ax.get_xlabel() == "feature 0" and ax.get_ylabel() == "feature 1"


def test_plot_clusters_legend_shows_each_colour_large_enough_and_centres_neutral() -> None:
    # 20,000 points are drawn as 2-point dots: a legend copied from them is unreadable.
    X, labels, centers = _blobs([8000, 6000, 6000], d=2)
    ax = plot_clusters(X, labels, centers, max_points=20_000)
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["cluster 0", "cluster 1", "cluster 2", "centres"]
    handles = legend.legend_handles
    faces = [to_rgba(h.get_markerfacecolor()) for h in handles]
    np.testing.assert_allclose([f[:3] for f in faces[:3]], [_rgba(c)[0, :3] for c in ax.collections[:3]])
    assert all(h.get_markersize() >= 6 for h in handles)
    assert faces[3] not in faces[:3] and to_rgba(handles[3].get_markeredgecolor()) == (0, 0, 0, 1)


def test_plot_clusters_projects_points_and_centres_with_pca_when_d_exceeds_2() -> None:
    X, labels, centers = _blobs([60, 60, 80, 50], d=6, seed=1)
    ax = plot_clusters(X, labels, centers)
    # Reference by another route: eigenvectors of the covariance matrix. A component's sign is
    # arbitrary, so align it with the plot's, then demand that the centres went the same way.
    mean = X.mean(axis=0)
    evals, evecs = np.linalg.eigh(np.cov(X - mean, rowvar=False))
    top = evecs[:, ::-1][:, :2]
    got = np.concatenate([c.get_offsets() for c in ax.collections[:4]])
    ref = np.concatenate([((X - mean) @ top)[labels == c] for c in range(4)])
    signs = np.sign(np.sum(got * ref, axis=0))
    np.testing.assert_allclose(got, ref * signs, atol=1e-8)
    np.testing.assert_allclose(ax.collections[4].get_offsets(), (centers - mean) @ top * signs, atol=1e-8)
    ratio = evals[::-1][:2] / evals.sum()
    assert ax.get_xlabel() == f"PC1 ({100 * ratio[0]:.1f}% var)"
    assert ax.get_ylabel() == f"PC2 ({100 * ratio[1]:.1f}% var)"


def test_plot_clusters_centres_sit_at_the_projected_mean_of_their_points() -> None:
    # Each centre is its cluster's mean, so projected with the points' own fit (PCA is affine) it
    # lands on the mean of its cluster's projected points; a separate fit would not.
    X, labels, centers = _blobs([400, 300, 300], d=5, seed=4)
    ax = plot_clusters(X, labels, centers)
    for c in range(3):
        np.testing.assert_allclose(
            ax.collections[3].get_offsets()[c], ax.collections[c].get_offsets().mean(axis=0), atol=1e-8
        )


def test_plot_clusters_pca_without_spread() -> None:
    for X in (np.ones((1, 3)), np.ones((4, 3))):
        ax = plot_clusters(X, np.zeros(len(X), dtype=int), X[:1])
        np.testing.assert_allclose(ax.collections[0].get_offsets(), np.zeros((len(X), 2)), atol=1e-12)
        np.testing.assert_allclose(ax.collections[1].get_offsets(), [[0.0, 0.0]], atol=1e-12)
        assert ax.get_xlabel() == "PC1 (0.0% var)" and ax.get_ylabel() == "PC2 (0.0% var)"


def test_plot_clusters_subsamples_deterministically_keeping_every_cluster() -> None:
    X, labels, centers = _blobs([3000, 1900, 2], d=3, seed=2)  # cluster 2 has 2 of 4,902 points
    ax = plot_clusters(X, labels, centers, max_points=300, random_state=7)
    counts = [len(c.get_offsets()) for c in ax.collections[:3]]
    assert sum(counts) == 300 and min(counts) >= 1
    assert 80 < counts[1] < 150  # its share: 300 * 1900 / 4902 = 116 expected, sd about 8
    assert ax.get_title() == "N = 4,902, k = 3 (300 points shown)"
    again = plot_clusters(X, labels, centers, max_points=300, random_state=7)
    other = plot_clusters(X, labels, centers, max_points=300, random_state=8)
    same = [
        np.array_equal(a.get_offsets(), b.get_offsets()) for a, b in zip(ax.collections, again.collections, strict=True)
    ]
    assert all(same)
    assert not np.array_equal(ax.collections[0].get_offsets(), other.collections[0].get_offsets())


def test_subsample_draws_distinct_rows_from_every_cluster() -> None:
    codes = np.repeat([0, 1, 2], [500, 499, 1])
    keep = plotting._clusters._subsample(codes, 50, random_state=0)
    assert len(keep) == 50 == len(np.unique(keep))
    assert set(codes[keep]) == {0, 1, 2}


def test_plot_clusters_without_centres_with_string_labels_and_many_clusters() -> None:
    X, labels, _ = _blobs([20, 30], d=2)
    names = np.where(labels == 0, "a", "b")
    ax = plot_clusters(X, names)
    assert [c.get_label() for c in ax.collections] == ["cluster a", "cluster b"]
    assert ax.get_title() == "N = 50, k = 2"
    for k in (15, 40):
        X, labels, centers = _blobs([5] * k, d=2, seed=k)
        ax = plot_clusters(X, labels, centers)
        faces = np.array([_rgba(c)[0] for c in ax.collections[:k]])
        assert len(np.unique(faces.round(6), axis=0)) == k


def test_plot_clusters_draws_into_given_axes() -> None:
    X, labels, centers = _blobs([10, 10], d=2)
    fig, ax = plt.subplots()
    assert plot_clusters(X, labels, centers, ax=ax) is ax
    assert len(fig.axes) == 1 and len(ax.collections) == 3


@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "match"),
    [
        (
            (np.zeros(5), np.zeros(5)),
            {},
            ValueError,
            r"X must be 2-D \(n_samples, n_features\); got shape \(5,\)",
        ),
        ((np.zeros((5, 1)), np.zeros(5)), {}, ValueError, "at least 2 features"),
        (
            (np.zeros((5, 2)), np.zeros(4)),
            {},
            ValueError,
            r"one entry per row of X: len\(X\) == 5; got labels of shape \(4,\)",
        ),
        (
            (np.zeros((5, 2)), np.zeros(5), np.zeros((2, 3))),
            {},
            ValueError,
            r"centers must have shape \(k, 2\).*got \(2, 3\)",
        ),
        (
            (np.zeros((5, 2)), [0, 1, 2, 0, 1], np.zeros((2, 2))),
            {},
            ValueError,
            r"labels must be in 0\.\.1 .*got label 2",
        ),
        ((np.zeros((5, 2)), ["a"] * 5, np.zeros((1, 2))), {}, ValueError, "labels must be integers 0..0"),
        (
            (np.zeros((5, 2)), [0, 1, 2, 0, 1]),
            {"max_points": 2},
            ValueError,
            r"max_points must be >= the number of clusters \(3\).*got 2",
        ),
        ((np.zeros((5, 2)), np.zeros(5)), {"max_points": 2.5}, TypeError, "max_points must be an integer; got 2.5"),
        ((np.array([[0.0, np.nan], [1, 1]]), [0, 1]), {}, ValueError, "1 of 2 rows hold NaN or inf"),
        ((np.zeros((0, 2)), []), {}, ValueError, "at least one row"),
    ],
)
def test_plot_clusters_rejects_bad_input(args, kwargs, exc, match) -> None:
    with pytest.raises(exc, match=match):
        plot_clusters(*args, **kwargs)


# --------------------------------------------------------------------------------------------------
# plot_inertia


class _FakeEstimator:
    def fit(self, X):  # pragma: no cover - only its presence matters
        return self

    def get_params(self):  # pragma: no cover
        return {}


def test_plot_inertia_list_estimator_and_dict_of_runs() -> None:
    ax = plot_inertia([100.0, 40.0, 35.0, 34.5])
    (line,) = ax.get_lines()
    np.testing.assert_array_equal(line.get_xdata(), [1, 2, 3, 4])
    np.testing.assert_array_equal(line.get_ydata(), [100.0, 40.0, 35.0, 34.5])
    assert ax.get_yscale() == "log" and ax.get_legend() is None

    fitted = SimpleNamespace(inertia_history_=np.array([9.0, 4.0, 3.0]))
    ax = plot_inertia({"k-means++": fitted, "random": [12.0, 6.0, 5.0, 4.0, 3.5]}, log=False)
    lines = _lines(ax)
    np.testing.assert_array_equal(lines["k-means++"].get_ydata(), [9.0, 4.0, 3.0])
    np.testing.assert_array_equal(lines["random"].get_xdata(), [1, 2, 3, 4, 5])
    assert ax.get_yscale() == "linear"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["k-means++", "random"]
    assert lines["k-means++"].get_color() != lines["random"].get_color()

    _, given = plt.subplots()
    assert plot_inertia(fitted, ax=given) is given and len(given.get_lines()) == 1


@pytest.mark.parametrize(
    ("value", "kwargs", "exc", "match"),
    [
        ([5.0, 0.0], {}, ValueError, r"log=True needs inertia > 0; the history holds 0\. Pass log=False"),
        ({"a": [1.0], "b": [2.0, -1.0]}, {}, ValueError, "the history of 'b' holds -1\\. Pass"),
        ([], {}, ValueError, r"non-empty 1-D sequence of inertias; got shape \(0,\)"),
        ({}, {}, ValueError, "empty dict"),
        (_FakeEstimator(), {}, TypeError, "estimator without inertia_history_ .*_FakeEstimator"),
        ("abc", {}, TypeError, "sequence of inertias, one per iteration; got str"),
        ({"run": [[1.0, 2.0]]}, {}, ValueError, r"inertia_history\['run'\] must be a non-empty 1-D"),
    ],
)
def test_plot_inertia_rejects_bad_input(value, kwargs, exc, match) -> None:
    with pytest.raises(exc, match=match):
        plot_inertia(value, **kwargs)


# --------------------------------------------------------------------------------------------------
# plot_timing


def _bars(ax, label: str) -> list:
    container = next(c for c in ax.containers if c.get_label() == label)
    return list(container)


def test_plot_timing_reads_the_fit_history_layout() -> None:
    h = _fit_history(3, 2)
    ax = plot_timing(h)
    compute, comm = np.mean(h["compute_seconds"], axis=1), np.mean(h["comm_seconds"], axis=1)
    low, high = _bars(ax, "compute"), _bars(ax, "communication")
    assert [b.get_x() + b.get_width() / 2 for b in low] == [3, 4, 5]  # history["epoch"] + 1
    np.testing.assert_allclose([b.get_height() for b in low], compute)
    np.testing.assert_allclose([b.get_y() for b in high], compute)
    np.testing.assert_allclose([b.get_y() + b.get_height() for b in high], compute + comm)
    assert low[0].get_facecolor() != high[0].get_facecolor()
    assert ax.get_ylabel() == "seconds (mean over 2 ranks)"


def test_plot_timing_per_rank_draws_one_stacked_bar_per_rank_and_epoch() -> None:
    h = _fit_history(3, 4)
    ax = plot_timing(h, per_rank=True)
    compute, comm = np.asarray(h["compute_seconds"]), np.asarray(h["comm_seconds"])
    for r in range(4):
        low, high = _bars(ax, f"compute rank {r}"), _bars(ax, f"communication rank {r}")
        np.testing.assert_allclose([b.get_height() for b in low], compute[:, r])
        np.testing.assert_allclose([b.get_y() + b.get_height() for b in high], compute[:, r] + comm[:, r])
    centres = [b.get_x() + b.get_width() / 2 for r in range(4) for b in _bars(ax, f"compute rank {r}")[:1]]
    assert (
        centres == sorted(centres) and 2.5 < centres[0] < centres[-1] < 3.5
    )  # ranks left to right in epoch 3
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["compute", "communication"]


def test_plot_timing_per_rank_over_many_epochs_averages_groups_of_epochs() -> None:
    rng = np.random.default_rng(5)
    compute, comm = rng.uniform(1, 2, (36, 3)), rng.uniform(0.1, 0.5, (36, 3))
    h = {"epoch": list(range(36)), "compute_seconds": compute.tolist(), "comm_seconds": comm.tolist()}
    ax = plot_timing(h, per_rank=True)
    for r in range(3):
        low, high = _bars(ax, f"compute rank {r}"), _bars(ax, f"communication rank {r}")
        assert len(low) == 12  # 36 epochs in groups of 3
        np.testing.assert_allclose([b.get_height() for b in low], compute[:, r].reshape(12, 3).mean(axis=1))
        np.testing.assert_allclose([b.get_y() + b.get_height() for b in high],
                                   (compute[:, r] + comm[:, r]).reshape(12, 3).mean(axis=1))
        assert low[0].get_width() > 0.5  # a third of three epochs' width, not a hairline
    assert "mean of each 3 epochs" in ax.get_title()
    assert "mean of each" not in plot_timing(h).get_title()  # one mean bar per epoch stays as it is


def test_plot_timing_one_rank_into_given_axes() -> None:
    compute, comm = [[3.0], [2.5], [2.75]], [[0.5], [0.75], [0.25]]
    _, ax = plt.subplots()
    assert plot_timing({"epoch": [0, 1, 2], "compute_seconds": compute, "comm_seconds": comm}, ax=ax) is ax
    low, high = _bars(ax, "compute"), _bars(ax, "communication")
    assert [b.get_x() + b.get_width() / 2 for b in low] == [1, 2, 3]
    assert [b.get_height() for b in low] == [3.0, 2.5, 2.75]
    assert [b.get_y() for b in high] == [3.0, 2.5, 2.75]
    np.testing.assert_allclose([b.get_height() for b in high], [0.5, 0.75, 0.25])
    assert ax.get_ylabel() == "seconds"
    # per_rank with one rank: the same single bar per epoch
    one = plot_timing({"compute_seconds": compute, "comm_seconds": comm}, per_rank=True)
    assert len(_bars(one, "compute")) == 3


@pytest.mark.parametrize(
    ("history", "exc", "match"),
    [
        (
            {"loss": LOSS},
            ValueError,
            r"needs 'compute_seconds' and 'comm_seconds' \(epochs x ranks\).*\['loss'\]\. Train with mpinb",
        ),
        (SimpleNamespace(history={"loss": LOSS}), ValueError, r"needs 'compute_seconds'"),  # Keras History
        ({"compute_time": [[1.0]], "comm_time": [[1.0]]}, ValueError, r"needs 'compute_seconds'"),
        ([{"compute_seconds": 1.0}], TypeError, "got list"),
        (
            {"compute_seconds": [[1], [2]], "comm_seconds": [[1]]},
            ValueError,
            r"same shape \(epochs x ranks\); got \(2, 1\) and \(1, 1\)",
        ),
        ({"compute_seconds": [[1, 2]], "comm_seconds": [[1, 2, 3]]}, ValueError, r"\(1, 2\) and \(1, 3\)"),
        (
            {"compute_seconds": [1, 2], "comm_seconds": [1, 1]},
            ValueError,
            r"history\['compute_seconds'\] must be an epochs x ranks table",
        ),
        (
            {"compute_seconds": [[1], [-2]], "comm_seconds": [[1], [1]]},
            ValueError,
            r"history\['compute_seconds'\] must hold seconds >= 0; got -2",
        ),
        (
            {"compute_seconds": [[1], [float("nan")]], "comm_seconds": [[1], [1]]},
            ValueError,
            "must hold seconds >= 0; got nan",
        ),
        ({"compute_seconds": [], "comm_seconds": []}, ValueError, r"epochs x ranks table.*shape \(0,\)"),
    ],
)
def test_plot_timing_rejects_bad_history(history, exc, match) -> None:
    with pytest.raises(exc, match=match):
        plot_timing(history)
    assert plt.get_fignums() == []


# --------------------------------------------------------------------------------------------------
# The histories themselves


def test_plot_loss_and_plot_timing_read_what_fit_and_keras_return() -> None:
    keras = pytest.importorskip("keras")
    mk = pytest.importorskip("mpinb.keras")
    from mpi4py import MPI

    rng = np.random.default_rng(0)
    X = rng.normal(size=(128, 4)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64)

    def model():
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
        m.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        return m

    fitted = mk.fit(model(), X, y, batch_size=32, epochs=2, validation_data=(X[:32], y[:32]), verbose=0,
                    comm=MPI.COMM_SELF)
    lines = _lines(plot_loss(fitted))
    assert sorted(lines) == ["rank 0", "train", "validation"]
    np.testing.assert_allclose(lines["rank 0"].get_ydata(), np.asarray(fitted["rank_loss"])[:, 0])
    np.testing.assert_allclose(lines["train"].get_ydata(), fitted["loss"])
    assert len(_bars(plot_timing(fitted), "communication")) == 2

    history = model().fit(X, y, batch_size=32, epochs=2, verbose=0)
    assert isinstance(history, keras.callbacks.History)
    lines = _lines(plot_loss(history))
    assert sorted(lines) == ["train"]
    np.testing.assert_allclose(lines["train"].get_ydata(), history.history["loss"])


# --------------------------------------------------------------------------------------------------
# plot_speedup


def test_plot_speedup_values_ideal_line_and_second_series() -> None:
    ax = plot_speedup([4, 1, 2], [2.5, 8.0, 4.5], label="fused")
    lines = _lines(ax)
    np.testing.assert_array_equal(lines["fused"].get_xdata(), [1, 2, 4])
    np.testing.assert_allclose(lines["fused"].get_ydata(), [1.0, 8 / 4.5, 8 / 2.5])
    np.testing.assert_allclose(lines["ideal"].get_xydata(), [[1, 1], [4, 4]])
    assert plot_speedup([1, 2, 4, 8], [8.0, 4.0, 2.0, 1.25], ax=ax, label="unfused") is ax
    lines = _lines(ax)
    assert len([k for k in lines if k == "ideal"]) == 1 and len(ax.get_lines()) == 3
    np.testing.assert_allclose(lines["ideal"].get_xydata(), [[1, 1], [8, 8]])
    assert ax.get_ylim()[1] >= 8  # the extended ideal line stays in view
    np.testing.assert_allclose(lines["unfused"].get_ydata(), [1.0, 2.0, 4.0, 6.4])
    assert list(ax.get_xticks()) == [1, 2, 4, 8]
    assert ax.get_xlabel() == "ranks" and ax.get_ylabel() == "speed-up"


@pytest.mark.parametrize(
    ("ranks", "seconds", "match"),
    [
        ([1, 2], [1.0], r"one time per rank count; got shapes \(2,\) and \(1,\)"),
        ([0, 2], [1.0, 1.0], r"ranks must be integers >= 1; got \[0, 2\]"),
        ([1, 1.5], [1.0, 1.0], "ranks must be integers >= 1"),
        ([2, 2], [1.0, 1.0], r"ranks must be distinct .*got \[2, 2\]"),
        ([1, 2], [1.0, 0.0], r"seconds must be finite and > 0; got \[1\.0, 0\.0\]"),
    ],
)
def test_plot_speedup_rejects_bad_input(ranks, seconds, match) -> None:
    with pytest.raises(ValueError, match=match):
        plot_speedup(ranks, seconds)


# --------------------------------------------------------------------------------------------------
# Module hygiene


def test_importing_plotting_loads_neither_matplotlib_nor_mpi() -> None:
    code = (
        "import sys, mpinb.client.plotting; "
        "print([m for m in ('matplotlib', 'mpi4py.MPI', 'sklearn') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_bad_axes_argument_is_rejected() -> None:
    with pytest.raises(TypeError, match="ax must be a matplotlib Axes .*got str"):
        plot_loss({"loss": LOSS}, ax="left")


@pytest.mark.parametrize("name", plotting.__all__)
def test_public_functions_say_they_are_client_helpers(name: str) -> None:
    doc = getattr(plotting, name).__doc__
    assert doc.split("\n\n")[1].strip().startswith("Client.")


@pytest.mark.parametrize("value", [(np.zeros(2), np.zeros(2)), None, 3])
def test_watch_refuses_what_is_not_an_async_result_before_drawing(value) -> None:
    # `_` rebound by a later cell (``init, _ = ...``) used to fail at the first poll with an AttributeError.
    from mpinb.live import watch

    with pytest.raises(TypeError, match=r"watch\(\) takes the AsyncResult of a `%%px --noblock` cell.*got "
                                        + type(value).__qualname__):
        watch(value, display=False)


def test_watch_leaves_a_line_of_text_where_its_progress_bar_was(monkeypatch) -> None:
    # A saved notebook keeps a widget without its state: its text stand-in was the bar's first frame.
    pytest.importorskip("ipywidgets")
    import IPython.display

    from mpinb.live import KEY, watch

    shown: list[list] = []

    class Handle:
        def __init__(self, first) -> None:
            self.history = [first]

        def update(self, obj) -> None:
            self.history.append(obj)

    def display(obj, display_id=False):
        shown.append((handle := Handle(obj)).history)
        return handle

    message = {"run": "r", "kind": "loss", "step": 3, "total": 3, "done": True, "steps": [1, 2, 3],
               "series": {"loss": [1.0, 0.5, 0.25]}}
    ar = SimpleNamespace(ready=lambda: True, get=lambda: "result", data={KEY: message})
    monkeypatch.setattr(IPython.display, "display", display)
    seen = watch(ar, display=True)
    bar_history = shown[0]
    assert type(bar_history[0]).__name__ == "IntProgress" and bar_history[0].value == 3
    assert type(bar_history[-1]).__name__ == "Pretty" and bar_history[-1].data == "progress: epoch 3 of 3, done"
    assert bar_history[0].comm is None  # the widget was closed
    assert seen.result == "result"
