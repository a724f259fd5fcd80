"""Which preprocessors decode a new stream, and how many it would need to keep its pace."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fleet.profiling.document import decode_rates
from fleet.profiling.plan import needed_preprocessors
from fleet.schedule.bundling import bundle_rate
from fleet.schedule.decoders import pick_decoders
from fleet.schedule.rates import RateTable


def pick_preprocessors(topology, busy: Iterable[tuple[int, ...]], master_ranks: Sequence[int],
                       launching: int, nodes: Iterable[int] | None = None) -> tuple[int, ...]:
    """Least-loaded preprocessors, node-local first; a fair share of all of them
    (`fleet.schedule.decoders.pick_decoders`, which the simulator's predictions use too).

    Args:
        topology: the run's `Topology` (ranks and their nodes).
        busy: the preprocessors of each stream that still has (or gets) members.
        master_ranks: the new stream's group masters (their nodes are preferred).
        launching: how many new streams this decision starts (they share what is free).
        nodes: only preprocessors of these nodes (a partition's, for a visit of partitioned
            data); None: any.
    """
    within = None if nodes is None else set(nodes)
    allowed = {r: topology.node_of(r) for r in topology.preprocessor_ranks()
               if within is None or topology.node_of(r) in within}
    return pick_decoders(allowed, busy, [topology.node_of(rank) for rank in master_ranks], launching)


def preprocessors_needed(rates: RateTable, members: Iterable[tuple[tuple[str, ...], int]]) -> int | None:
    """Preprocessors that keep up with a stream of `members` ((models, GPU count) pairs: one
    model, or a bundle's, which moves at the bundle's rate) at its pace (the slowest member at
    the current, possibly refined, rates), from the profile's decode throughput; None without one."""
    decode = decode_rates(rates.extra.get("preprocessing", {}))
    if not decode:
        return None
    pace = min(bundle_rate(rates, models) if len(models) > 1 else rates.rate(models[0], gpus)
               for models, gpus in members)
    return needed_preprocessors([pace], decode, nodes=1)
