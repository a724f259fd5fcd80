"""Which preprocessors decode a stream, and what each stream gets of their decoding (pure).

The coordinator gives a new stream a fair share of the preprocessors, the least loaded first
and those on its masters' nodes before others: ``P // (streams that keep theirs + streams
starting now)`` of them, at least one (`pick_decoders`). A preprocessor produces the chunks of
its streams in turn, and a stream takes its chunks from its preprocessors in turn; so a stream
moves at most as fast as its number of preprocessors times the least any of them gives it.
`assigned_shares` divides the preprocessors' decoding among the streams that way, max-min
fair: where one preprocessor serves four streams and another one, the four share the first.
The simulator uses both, so that a prediction sees the same assignment the runtime makes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

EPS = 1e-9


def pick_decoders(nodes_of: Mapping[int, int], busy: Iterable[tuple[int, ...]], master_nodes: Iterable[int],
                  launching: int) -> tuple[int, ...]:
    """Least-loaded preprocessors for a new stream, node-local first; a fair share of them.

    Args:
        nodes_of: the preprocessors it may take (by id, in order), each with its node.
        busy: the preprocessors of each stream that still has (or gets) members.
        master_nodes: the nodes of the new stream's group masters (preferred).
        launching: how many new streams this decision starts (they share what is free).
    """
    busy = [used for used in busy if set(used) & set(nodes_of)]
    load = {p: sum(p in used for used in busy) for p in nodes_of}
    share = max(1, len(load) // max(1, len(busy) + launching))
    local = set(master_nodes)
    ranked = sorted(load, key=lambda p: (load[p], nodes_of[p] not in local, p))
    return tuple(sorted(ranked[:share]))


def assigned_shares(demands: Mapping[int, float], decoders: Mapping[int, tuple[int, ...]],
                    capacity: float) -> dict[int, float]:
    """Samples/s each stream (by id) decodes: max-min fair over its `demands` (the pace it could
    use), where a stream's chunks come in turn from its `decoders` (so a pace ``r`` takes
    ``r / len(decoders)`` of each) and each preprocessor decodes `capacity` samples/s; by
    progressive filling (every stream still growing grows alike until it reaches its demand
    or one of its preprocessors has nothing left)."""
    shares = dict.fromkeys(demands, 0.0)
    left = {p: capacity for stream in demands for p in decoders[stream]}
    growing = {s for s, demand in demands.items() if demand > 0 and decoders[s]}
    while growing:
        weights: dict[int, float] = {}
        for stream in growing:
            for p in decoders[stream]:
                weights[p] = weights.get(p, 0.0) + 1.0 / len(decoders[stream])
        step = min(min(demands[s] - shares[s] for s in growing), min(left[p] / w for p, w in weights.items()))
        for stream in growing:
            shares[stream] += step
        for p, weight in weights.items():
            left[p] -= step * weight
        spent = {p for p in weights if left[p] <= EPS * max(1.0, capacity)}
        growing = {s for s in growing
                   if demands[s] - shares[s] > EPS * max(1.0, demands[s]) and not spent & set(decoders[s])}
    return shares
