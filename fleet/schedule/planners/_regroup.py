"""fleet-adaptive's regrouping: members paced well below their own rate move to a better stream.

A stream moves at its slowest member's rate, so every faster member idles part of the time
(pacing slack). Which models share a stream is decided when they start, among the few that
are free then; later, as members converge and others join, a member may find itself much
faster than its stream, or a stream held back by one slow member. A checkpoint and a restore
(seconds) move a member to another running stream, where it reads from that stream's current
position; no stream is opened, so nothing more is decoded. Two moves are weighed:

* **A paced member** (faster than its stream) moves to the running stream whose slowest own
  rate is the highest one at or below its own (it slows no one there), when that pace is at
  least ``gain`` faster than where it is.
* **A pacer** (the unique slowest member, the next-slowest at least ``gain`` faster) moves to
  the stream whose slowest own rate is the highest at or below its own: its stream speeds up
  to the next-slowest rate for as long as the pacer would have stayed, and the pacer may be
  paced a little where it lands.

A move is made only when the GPU-seconds it saves exceed ``margin`` times the GPU-seconds its
checkpoint and restore cost.

Pure: numbers in, moves out. A member's forecast samples left and the cost of its move are
asked for (``Costs``) only where a move is weighed, so that a policy with a thousand running
models does not forecast them all on every call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class Seat:
    """A running member as regrouping sees it.

    Attributes:
        model: model id.
        gpus: GPUs it holds.
        rate: its own rate on them (samples/s).
    """

    model: str
    gpus: int
    rate: float


@dataclass(frozen=True)
class Costs:
    """What a move is weighed with, asked per model.

    Attributes:
        remaining: samples the model is forecast to still need.
        switch_s: seconds a move costs it (checkpoint + restore).
    """

    remaining: Callable[[str], float]
    switch_s: Callable[[str], float]


@dataclass(frozen=True)
class Group:
    """A running stream: its id, its pace (samples/s) and its members (``Seat``)."""

    id: int
    pace: float
    seats: tuple[Seat, ...]

    @cached_property
    def slowest(self) -> float:
        """The lowest own rate among its members: the pace a joiner at or above it keeps."""
        return min(s.rate for s in self.seats)

    @cached_property
    def ranked(self) -> list[Seat]:
        """Its seats, slowest first (ties in seat order)."""
        return sorted(self.seats, key=lambda s: s.rate)


def regroup(groups: Sequence[Group], costs: Costs, margin: float, gain: float) -> dict[str, int]:
    """Moves worth making: model -> id of the stream it should join."""
    live = [g for g in groups if g.pace > 0 and g.seats]
    if len(live) < 2:
        return {}
    slowest = np.array([g.slowest for g in live])
    order = np.argsort(slowest, kind="stable")
    targets = iter(_paced_targets(live, slowest, order, gain))
    moves: dict[str, int] = {}
    for group in live:
        pacer = _pacer_move(group, live, slowest[order], order, costs, margin, gain)
        moves.update(pacer)
        for seat, target in zip(group.seats, targets):
            if target < 0 or seat.model in moves:
                continue
            saved = seat.gpus * costs.remaining(seat.model) * (1 / group.pace - 1 / live[target].slowest)
            if saved > margin * seat.gpus * costs.switch_s(seat.model):
                moves[seat.model] = live[target].id
    return moves


def _paced_targets(live: Sequence[Group], slowest: np.ndarray, order: np.ndarray, gain: float) -> list[int]:
    """Per seat of ``live`` (group by group), the index in ``live`` of the stream a paced member
    would move to (`_nearest_below`), where it would go at least ``gain`` faster there; -1 where
    not. All seats at once: a stream's pace moves every time a member leaves it."""
    rates = np.array([s.rate for g in live for s in g.seats])
    owner = np.repeat(np.arange(len(live)), [len(g.seats) for g in live])
    pace = np.array([g.pace for g in live])[owner]
    k = np.searchsorted(slowest[order], rates * (1 + 1e-9), side="right") - 1
    k[(k >= 0) & (order[np.maximum(k, 0)] == owner)] -= 1  # not its own stream
    target = np.where(k >= 0, order[np.maximum(k, 0)], -1)
    worth = (rates > pace * (1 + 1e-9)) & (target >= 0) & (slowest[np.maximum(target, 0)] > pace * (1 + gain))
    return np.where(worth, target, -1).tolist()


def _nearest_below(rate: float, own: int, live: Sequence[Group], sorted_slowest: np.ndarray,
                   order: np.ndarray) -> Group | None:
    """The stream (not ``own``) whose slowest rate is the highest at or below ``rate``."""
    k = int(np.searchsorted(sorted_slowest, rate * (1 + 1e-9), side="right")) - 1
    while k >= 0 and live[order[k]].id == own:
        k -= 1
    return live[order[k]] if k >= 0 else None


def _pacer_move(group: Group, live: Sequence[Group], sorted_slowest: np.ndarray, order: np.ndarray,
                costs: Costs, margin: float, gain: float) -> dict[str, int]:
    """{pacer: stream} when moving the stream's unique slowest member out is worth it."""
    if len(group.seats) < 2:
        return {}
    ranked = group.ranked
    pacer, second = ranked[0], ranked[1].rate
    if second <= pacer.rate * (1 + gain):
        return {}
    target = _nearest_below(pacer.rate, group.id, live, sorted_slowest, order)
    if target is None:
        return {}
    left = costs.remaining(pacer.model)
    stay = left / pacer.rate  # how long it would still hold its stream back
    saved = sum(s.gpus * min(stay, costs.remaining(s.model) / pacer.rate) * (1 - pacer.rate / second)
                for s in ranked[1:])
    lost = pacer.gpus * left * (1 / target.slowest - 1 / pacer.rate)
    if saved - lost > margin * pacer.gpus * costs.switch_s(pacer.model):
        return {pacer.model: target.id}
    return {}
