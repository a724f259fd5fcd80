"""Helpers the planners share: turning a flotilla into a placed stream."""

from __future__ import annotations

from collections.abc import Sequence

from fleet.schedule._base import Member, StreamPlan
from fleet.schedule.flotilla import Flotilla, create_flotilla
from fleet.schedule.placement import place
from fleet.schedule.rates import RateTable


def placed_stream(flotilla: Flotilla, free_gpus: Sequence[int], gpus_per_node: int) -> StreamPlan:
    """Place a flotilla's members on ``free_gpus`` (Alg. 3/4) as one new stream."""
    runs = place([m.gpus for m in flotilla.members], free_gpus, gpus_per_node)
    return StreamPlan(tuple(Member(m.model, run) for m, run in zip(flotilla.members, runs)))


def flotilla_stream(
    rates: RateTable,
    candidates: Sequence[str],
    free_gpus: Sequence[int],
    gpus_per_node: int,
    delta: float | None,
) -> StreamPlan:
    """Alg. 2 over ``candidates`` on ``free_gpus``, then Alg. 3/4: one new stream."""
    flotilla = create_flotilla(rates, candidates, len(free_gpus), delta)
    return placed_stream(flotilla, free_gpus, gpus_per_node)


def single_gpu_streams(models: Sequence[str], free_gpus: Sequence[int]) -> list[StreamPlan]:
    """One stream per model, each on one GPU (models and GPUs paired in order)."""
    return [StreamPlan((Member(m, (g,)),)) for m, g in zip(models, free_gpus)]
