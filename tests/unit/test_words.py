"""How messages name ranks: runs of consecutive ranks as ranges, one way everywhere."""

from __future__ import annotations

import pytest

from mpinb._words import describe_mismatch, on_ranks, rank_ranges, ranks


@pytest.mark.parametrize("values, text", [([0, 1, 2, 5, 7, 8], "0-2, 5, 7-8"), ([4], "4"), ([3, 1], "1, 3")])
def test_rank_ranges(values, text):
    assert rank_ranges(values) == text


def test_ranks_and_where():
    assert ranks([2]) == "rank 2" and ranks([0, 1, 2, 3]) == "ranks 0-3"
    assert on_ranks([0], 1) == "on the only rank"
    assert on_ranks(range(4), 4) == "on all 4 ranks"
    assert on_ranks([1, 2, 3], 4) == "on ranks 1-3 of 4" and on_ranks([0, 2], 3) == "on ranks 0, 2 of 3"


def test_a_mismatch_groups_ranks_by_value_and_clips_long_values_to_their_difference():
    text = describe_mismatch("n_clusters", ["3", "3", "4", "3"])
    assert text == "n_clusters must be the same on every rank, but differs across 4 ranks (ranks 0-1, 3: 3; rank 2: 4)."
    long = ["x" * 200 + "a", "x" * 200 + "b"]
    clipped = describe_mismatch("layout", long)
    assert "..." in clipped and len(clipped) < 300 and "a;" in clipped and clipped.endswith("b).")


def test_a_mismatch_of_lists_names_the_first_differing_entry_in_full_with_its_name():
    from mpinb._words import Listed

    shapes = [((784, 512), "float32"), ((512,), "float32")] * 20
    other = list(shapes)
    other[25] = ((512, 10), "float32")
    names = [f"dense_{i}/kernel" for i in range(40)]
    sent = [Listed(shapes, names).detail, Listed(shapes, names).detail, Listed(other, names).detail]
    text = describe_mismatch("the model's weight shapes and dtypes", sent)
    assert "first at entry 25" in text, text
    assert "ranks 0-1: dense_25/kernel ((512,), 'float32')" in text and \
        "rank 2: dense_25/kernel ((512, 10), 'float32')" in text and "..." not in text, text
    shorter = describe_mismatch("weights", [Listed(shapes).detail, Listed(shapes[:3]).detail])
    assert "first at entry 3" in shorter and "rank 1: no entry 3 (3 entries)" in shorter, shorter
    assert "(rank 0: 40 entries; rank 1: 3 entries)" in shorter, shorter
    assert Listed(shapes) == repr(shapes)  # what the ranks compare is unchanged
