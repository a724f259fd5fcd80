"""Group sizes, keys and ids for learning over groups (`preprocess.groups`), and the maker's draw."""

import pytest

from preprocess.groups import group_key_names, group_sizes, id_part, zipf_sizes
from preprocess.make import sample_groups


def test_zipf_sizes_sum_to_the_total_and_fall_by_the_exponent():
    assert zipf_sizes(100, 4, 0.0) == [25, 25, 25, 25]
    sizes = zipf_sizes(1000, 10, 1.0, minimum=5)
    assert sum(sizes) == 1000 and min(sizes) >= 5 and sizes == sorted(sizes, reverse=True)
    assert sizes[0] / sizes[1] == pytest.approx(2, rel=0.05)  # past the minimum, 1 : 1/2
    with pytest.raises(ValueError, match="cannot give"):
        zipf_sizes(9, 10, 1.0)
    with pytest.raises(ValueError, match="exponent"):
        zipf_sizes(9, 3, -0.5)


def test_keys_sizes_and_ids():
    assert group_key_names(3) == ["g000", "g001", "g002"] and group_key_names(1001)[-1] == "g1000"
    assert group_sizes(["b", "a", "b", "c", "a", "b"]) == [("b", 3), ("a", 2), ("c", 1)]
    assert id_part("Berlin") == "berlin" and id_part("São Paulo / North") == "s-o-paulo-north" and id_part("!!") == "group"


def test_the_maker_draws_the_same_groups_from_the_same_seed():
    first = sample_groups(200, 6, 1.5, seed=3)
    assert first == sample_groups(200, 6, 1.5, seed=3) and first != sample_groups(200, 6, 1.5, seed=4)
    assert [n for _, n in group_sizes(first)] == zipf_sizes(200, 6, 1.5)
