"""FLEET Alg. 3/4 (placement): worked examples and properties."""

from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.schedule.placement import _placement_order, node_count, place


def test_worked_example_node_local_first():
    # gpn = 4, 12 free GPUs = nodes {0-3}, {4-7}, {8-11}; counts [3, 4, 1, 2, 2].
    # Step 1 (multiples of 4): member 1 (4 GPUs) takes node 0 -> 0-3.
    # Step 2 (pairs summing to a multiple of 4), largest first: 3 + 1 -> members 0, 2
    #   take node 1 (4-6 and 7); 2 + 2 -> members 3, 4 take node 2 (8-9 and 10-11).
    runs = place([3, 4, 1, 2, 2], range(12), 4)
    assert runs == ((4, 5, 6), (0, 1, 2, 3), (7,), (8, 9), (10, 11))
    assert all(node_count(r, 4) == 1 for r in runs)


def test_worked_example_permutation_search():
    # gpn = 4, 8 GPUs, counts [3, 3, 2]: no multiple of 4, no pair summing to 4 or 8.
    # Alg. 4 costs sum nodes(a_i)/m_i of each order:
    #   3,3,2: 1/3 + 2/3 + 1/2 = 1.5     3,2,3: 1/3 + 2/2 + 1/3 = 1.67     2,3,3: 1/2 + 2/3 + 1/3 = 1.5
    # The first best order (3,3,2) is kept.
    assert place([3, 3, 2], range(8), 4) == ((0, 1, 2), (3, 4, 5), (6, 7))


def test_partly_free_cluster_prefers_whole_free_nodes():
    # node 0 has GPUs 1 and 3 free, node 1 is entirely free: a 4-GPU member goes to node 1.
    runs = place([4, 2], [1, 3, 4, 5, 6, 7], 4)
    assert runs[0] == (4, 5, 6, 7) and runs[1] == (1, 3)


@st.composite
def placements(draw):
    gpn = draw(st.integers(1, 4))
    nodes = draw(st.integers(1, 6))
    total = gpn * nodes
    free = sorted(draw(st.sets(st.integers(0, total - 1), min_size=1)))
    counts = draw(st.lists(st.integers(1, 5), min_size=1, max_size=8))
    while sum(counts) > len(free):
        counts.pop()
    return gpn, free, counts


@settings(max_examples=100, deadline=None)
@given(placements())
def test_placement_properties(case):
    gpn, free, counts = case
    if not counts:
        return
    runs = place(counts, free, gpn)
    used = [g for r in runs for g in r]
    assert len(used) == len(set(used)), "each GPU holds at most one member"
    assert set(used) <= set(free)
    assert [len(r) for r in runs] == counts, "each member gets its count (>= 1)"
    order = _placement_order(free, gpn)
    for run in runs:  # runs are contiguous in the placement order
        start = order.index(run[0])
        assert tuple(order[start : start + len(run)]) == run


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4), st.lists(st.integers(1, 12), min_size=1, max_size=6))
def test_no_extra_nodes_when_a_node_local_choice_exists(gpn, counts):
    nodes = sum(-(-c // gpn) for c in counts) + 1  # room for every member on its own nodes
    runs = place(counts, range(nodes * gpn), gpn)
    for count, run in zip(counts, runs):
        if count % gpn == 0:
            assert node_count(run, gpn) == count // gpn
    # a lone member never spans more nodes than it must
    for count in counts:
        assert node_count(place([count], range(nodes * gpn), gpn)[0], gpn) == -(-count // gpn)
    # two members that fill one node together each stay on one node
    if gpn > 1:
        pair = place([1, gpn - 1], range(nodes * gpn), gpn)
        assert all(node_count(r, gpn) == 1 for r in pair)


def test_ten_thousand_members_place_without_recursion():
    # One member per frame of a recursive search overflowed Python's stack from about 1,000
    # members left to Alg. 4 (no multiple of gpn, no pair summing to one).
    counts = [1] * 9_000 + [3] * 1_000
    runs = place(counts, range(12_800), 8)
    used = [g for r in runs for g in r]
    assert [len(r) for r in runs] == counts
    assert len(set(used)) == len(used) == 12_000
    assert all(node_count(r, 8) == 1 for r in runs[:9_000])


def test_pairing_skips_a_partner_too_large_for_the_whole_free_nodes():
    # gpn = 8: nodes 0 and 1 wholly free (16 GPUs), nodes 2 and 3 with 6 free each.
    # In descending order 13, 11, 3: 13 + 11 = 24 is a multiple of 8 but exceeds the 16
    # whole-node GPUs, 13 + 3 = 16 fits, so 13 and 3 share nodes 0-1 and 11 takes the rest.
    free = [*range(16), *range(17, 23), *range(25, 31)]
    runs = place([13, 11, 3], free, 8)
    assert runs == (tuple(range(13)), (*range(17, 23), *range(25, 30)), (13, 14, 15))
