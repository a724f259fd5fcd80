"""How grouped learning cuts the groups' work into streams and lays them out (pure; issue 47).

A (group, configuration) model has ``s`` epoch-equivalent samples left; on ``m`` GPUs it trains
them in ``s / r(m)`` seconds. For a run that is to end by ``T``:

- each model's *width* (`width`) is the fewest GPUs on which it trains within ``T``: one GPU
  for every model that fits, data-parallel on more (up to its fastest count, the rate table's
  rates on those counts) for the models of a group too large for one;
- a model whose width would train it faster than ``T`` asks, where one GPU fewer is too slow,
  may *narrow* (`narrowed`): it trains its first epochs on the wider count and the rest, after a
  checkpoint, on the narrower one, ending by ``T`` on fewer GPU-seconds (between two counts the
  GPU-time it takes is the line between theirs, not the wider count's; most where a width
  crosses a node's boundary);
- each group's models become *units*, the streams it launches (`Unit`, `group_units`): all on
  one stream (the group's samples decoded once per epoch pass for all of them, the stream
  moving at its slowest member's pace), or rate-matched sets (`rate_matched`: models whose
  rates on their widths are within a tolerance of each other share a stream, the others get
  their own; the group is decoded once per stream, no member slowed by more than the
  tolerance); `decode_per_gpu` is what a plan's
  streams decode per busy GPU, which says whether the preprocessors have room for them;
- `scheduled` lays the units out as a list schedule (each starts, in order, on the GPUs that
  come free first; a small group's members at once, `together`), widening a unit that would
  end late (`widened`).

``T`` itself (`planned_end`) is the earliest end, from the grouped lower bound on
(`fleet.schedule.grouping.group_bound`), at which the models on their widths (or narrowing)
hold no more GPU-time than the job's GPUs have by then: a model widened past a node's GPUs gains less rate
than it takes GPUs, so a run whose largest group must be widened cannot end at the bound.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from fleet.schedule.rates import ModelProfile, useful_width


def fastest_count(profile: ModelProfile, gpus_per_node: int, limit: int) -> int:
    """The fewest GPUs (up to `limit`) on which `profile` trains fastest."""
    top = int(min(limit, useful_width(profile.rates, gpus_per_node)))
    return max(range(1, max(top, 1) + 1), key=lambda m: (profile.rate(m, gpus_per_node), -m))


def width(profile: ModelProfile, samples: float, target_s: float, gpus_per_node: int, limit: int) -> int:
    """The fewest GPUs (up to `limit`) on which `samples` train within `target_s` seconds; its
    fastest count where none does."""
    if samples / profile.rate(1, gpus_per_node) <= target_s:
        return 1
    fastest = fastest_count(profile, gpus_per_node, limit)
    for m in range(2, fastest):
        if samples / profile.rate(m, gpus_per_node) <= target_s:
            return m
    return fastest


def held_on_width(profile: ModelProfile, samples: float, end: float, gpus_per_node: int, limit: int) -> float:
    """GPU-seconds `samples` hold on their `width` for `end`."""
    m = width(profile, samples, end, gpus_per_node, limit)
    return m * samples / profile.rate(m, gpus_per_node)


Held = Callable[[ModelProfile, float, float, int, int], float]
"""GPU-seconds a model's samples hold when it is to end by a time: (profile, samples, end,
GPUs per node, the job's GPUs) -> seconds (`held_on_width`, or with narrowing)."""


def planned_end(work: Sequence[tuple[ModelProfile, float]], gpus: int, gpus_per_node: int, bound: float,
                held: Held = held_on_width) -> float:
    """When a plan of `work` (each model's profile and samples left) on `gpus` GPUs can end at
    the earliest: the first time ``T`` (from `bound`, the lower bound, on) at which the models,
    each on its `width` for ``T`` (`held`: the GPU-seconds it then holds), hold no more
    GPU-time than ``gpus * T`` (widening a model past a node's GPUs costs GPU-time: its rate
    grows less than its GPUs); packing them into that time is the list schedule's. Found by
    bisection (the GPU-time falls as ``T`` grows)."""
    def fits(end: float) -> bool:
        return sum(held(profile, samples, end, gpus_per_node, gpus) for profile, samples in work) <= gpus * end

    low, high = bound, max([bound] + [s / p.rate(1, gpus_per_node) for p, s in work])
    if not fits(low):
        for _ in range(40):
            middle = (low + high) / 2
            low, high = (low, middle) if fits(middle) else (middle, high)
            if high - low <= 1e-4 * bound:
                break
        low = high
    return low


@dataclass(frozen=True)
class Narrowing:
    """Where a model narrows: after `first` samples on its count it is checkpointed and trains
    the rest on `count` GPUs at `rate`.

    Attributes:
        first: epoch-equivalent samples it trains on its count (whole epochs).
        count: the GPUs it trains the rest on (fewer).
        rate: its rate there.
        pause_s: the checkpoint and restore between.
    """

    first: float
    count: int
    rate: float
    pause_s: float


NARROWEST = 4
"""Counts a narrowing model may start above its width and end below it."""
NARROW_GAIN = 2.0
"""A narrowing is kept where it saves more GPU-seconds than this many times its pause holds."""


def narrowed(profile: ModelProfile, samples: float, end: float, gpus_per_node: int, limit: int,
             pause_s: float, epoch: Callable[[float], float]) -> tuple[int, Narrowing | None]:
    """The count a model starts on to end by `end` on the fewest GPU-seconds, and where it
    narrows (None: it keeps its `width`): over a wider count ``a`` and a narrower ``b`` (up to
    `NARROWEST` either side of its width), ``a`` until the first epoch boundary (`epoch`: the
    samples up to the first boundary at or after the samples given) that leaves ``b`` the
    time to end by `end` after a pause of `pause_s` (checkpoint and restore, counted on ``a``
    GPUs); kept only where it holds less than the width does by more than `NARROW_GAIN` times
    what its pause holds."""
    m = width(profile, samples, end, gpus_per_node, limit)
    if m < 2 or samples / profile.rate(m, gpus_per_node) > end:
        return m, None
    rate = {c: profile.rate(c, gpus_per_node) for c in range(max(1, m - NARROWEST), m + NARROWEST)}
    best: tuple[float, int, Narrowing | None] = (math.inf, m, None)
    for a in range(m, min(fastest_count(profile, gpus_per_node, limit), m + NARROWEST - 1) + 1):
        for b in range(max(1, m - NARROWEST), m):
            if rate[b] >= rate[a]:
                continue
            first = epoch((samples / rate[b] + pause_s - end) / (1 / rate[b] - 1 / rate[a]))
            if not 0 < first < samples:
                continue
            option = Narrowing(first, b, rate[b], pause_s)
            best = min(best, (held_narrowing(samples, a, rate[a], option), a, option), key=lambda o: o[0])
    if best[0] + NARROW_GAIN * best[1] * pause_s < m * samples / rate[m]:
        return best[1], best[2]
    return m, None


def held_narrowing(samples: float, count: int, rate: float, narrowing: Narrowing | None) -> float:
    """GPU-seconds `samples` hold on `count` GPUs at `rate`, narrowing as `narrowing` says
    where it is given (its pause counted on `count` GPUs)."""
    if narrowing is None:
        return count * samples / rate
    narrow = narrowing.count * (samples - narrowing.first) / narrowing.rate
    return count * (narrowing.first / rate + narrowing.pause_s) + narrow


def widened(profile: ModelProfile, count: int, pace: float, gpus_per_node: int, limit: int) -> int:
    """The fewest GPUs, `count` or more (up to `limit`), on which `profile` trains at `pace` or
    faster; its fastest count where none does (`count` where that is fewer)."""
    fastest = fastest_count(profile, gpus_per_node, limit)
    for m in range(count, fastest):
        if profile.rate(m, gpus_per_node) >= pace:
            return m
    return max(count, fastest)


def rate_matched(rates: Sequence[float], tolerance: float) -> list[list[int]]:
    """Indices of `rates` in sets sharing a stream: the fastest first, each set taking the next
    rates while they are within `tolerance` of its fastest (its slowest moves it at least
    ``1 - tolerance`` of every member's rate)."""
    order = sorted(range(len(rates)), key=lambda i: (-rates[i], i))
    sets: list[list[int]] = []
    for i in order:
        if sets and rates[i] >= (1 - tolerance) * rates[sets[-1][0]]:
            sets[-1].append(i)
        else:
            sets.append([i])
    return sets


@dataclass(frozen=True)
class Unit:
    """One stream to launch: models of one group, each on its GPU count.

    Attributes:
        group: the group.
        models: the models, in the stream's order.
        counts: each model's GPUs.
        samples: each model's epoch-equivalent samples left.
        rates: each model's rate on its count (epoch-equivalent samples/s).
        scale: the group's epoch scale (epoch-equivalent samples per sample decoded).
        started: models of its stream launched before (the rest join that stream).
        narrowing: where a unit of one model narrows (`narrowed`), or None.
        together: its members start at once (`together`): a small group's, which a member
            joining its stream later would have decoded again.
    """

    group: str | None
    models: tuple[str, ...]
    counts: tuple[int, ...]
    samples: tuple[float, ...]
    rates: tuple[float, ...]
    scale: float = 1.0
    started: tuple[str, ...] = ()
    narrowing: Narrowing | None = None
    together: bool = False

    @property
    def gpus(self) -> int:
        """GPUs the unit takes when it starts."""
        return sum(self.counts)

    @property
    def pace(self) -> float:
        """Epoch-equivalent samples/s the stream moves at: its slowest member's rate."""
        return min(self.rates)

    @property
    def seconds(self) -> float:
        """How long the stream runs: its longest member at the stream's pace (a narrowing
        model: its first samples at that pace, the pause and the rest at its narrower rate)."""
        if self.narrowing is not None:
            n = self.narrowing
            return self.wide_seconds + n.pause_s + (self.samples[0] - n.first) / n.rate
        return max(self.samples) / self.pace

    @property
    def wide_seconds(self) -> float:
        """How long it trains before it narrows (`seconds` where it does not)."""
        return self.narrowing.first / self.pace if self.narrowing is not None else self.seconds

    @property
    def gpu_seconds(self) -> float:
        """GPU-seconds its members hold, each until it has trained its samples."""
        if self.narrowing is not None:
            return held_narrowing(self.samples[0], self.counts[0], self.pace, self.narrowing)
        return sum(c * s for c, s in zip(self.counts, self.samples)) / self.pace

    @property
    def decode_rate(self) -> float:
        """Samples/s its stream decodes (real samples: the pace over the group's scale)."""
        return self.pace / self.scale



def group_units(group: str | None, models: Sequence[str], counts: Sequence[int], samples: Sequence[float],
                rates: Sequence[float], scale: float, tolerance: float | None,
                narrowings: Sequence[Narrowing | None] = (), together: bool = False) -> list[Unit]:
    """The units of one group's `models` (each on its count, with its samples left and its rate
    there): rate-matched sets within `tolerance`, or one shared unit where it is None; in each,
    the models that train longest on their counts first (they start first). A model with a
    narrowing (`narrowings`, beside `models`) is a unit of its own. `together`: the units'
    members start at once (`Unit.together`)."""
    narrowings = list(narrowings) or [None] * len(models)
    whole = Unit(group, tuple(models), tuple(counts), tuple(samples), tuple(rates), scale, together=together)
    alone = [i for i, n in enumerate(narrowings) if n is not None]
    shared = [i for i, n in enumerate(narrowings) if n is None]
    if tolerance is None:
        sets = [shared]
    else:
        sets = [[shared[j] for j in matched] for matched in rate_matched([rates[i] for i in shared], tolerance)]
    units = [replace(_part(whole, [i]), narrowing=narrowings[i]) for i in alone]
    return units + [_part(whole, sorted(members, key=lambda i: (-samples[i] / rates[i], i))) for members in sets
                    if members]


def _part(unit: Unit, members: Sequence[int]) -> Unit:
    """`unit` of its `members` only (indices, in the order given)."""
    return Unit(unit.group, tuple(unit.models[i] for i in members), tuple(unit.counts[i] for i in members),
                tuple(unit.samples[i] for i in members), tuple(unit.rates[i] for i in members), unit.scale,
                unit.started, unit.narrowing if list(members) == [0] else None, unit.together)


def rest(unit: Unit, launched: int) -> Unit:
    """What is left of `unit` once its first `launched` members are launched."""
    return replace(_part(unit, range(launched, len(unit.models))), started=unit.started + unit.models[:launched])


JOIN_WAIT = 0.1
"""A small group's unit waits for the GPUs of all its members where that starts its first member
no later than this share of the unit's run (`together`)."""


def together(unit: Unit, gpus: int, wait: float) -> bool:
    """Whether `unit`'s members start at once, on a job of `gpus` GPUs, when GPUs for all of
    them are free, `wait` seconds after its first member could start: where the unit says so
    (`Unit.together`: a small group's), none of them started yet, the job has the GPUs for all
    and the wait is short (`JOIN_WAIT`); else each starts as its GPUs come free, joining the
    stream of those before it. A member that joins a running stream starts where the stream
    stands plus what it decoded ahead, and the stream decodes on for it: a small group's stream
    is a pass ahead by then, so the join costs the group a second decoding."""
    return unit.together and not unit.started and unit.gpus <= gpus and wait <= JOIN_WAIT * unit.seconds


def head_start(now: float, free: int, busy_ends: Sequence[float], need: int) -> float:
    """When a unit of `need` GPUs can start at the earliest, with `free` GPUs free at `now` and
    the busy ones predicted to come free at `busy_ends` (one a GPU; an overdue one at `now`)."""
    ends = sorted(max(now, end) for end in busy_ends)
    short = need - free
    if short <= 0:
        return now
    return ends[short - 1] if short <= len(ends) else math.inf


def decode_per_gpu(units: Sequence[Unit]) -> float:
    """Samples/s decoded per busy GPU, over the GPU-time of `units`: each stream decodes at its
    decode rate while it holds GPUs (its members' GPU-seconds)."""
    held = sum(u.gpu_seconds for u in units)
    if held <= 0:
        return 0.0
    return sum(u.decode_rate * u.seconds for u in units) / held


def scheduled(units: Sequence[Unit], gpus: int, end: float,
              widen: Callable[[Unit, float], Unit]) -> tuple[list[Unit], float]:
    """`units` as the list schedule that starts them in order widens them: each unit, in order,
    takes the GPUs that come free first (all free at 0), its members at once when the last of
    them has (`together`) or each as its GPUs come free, and a unit that would end after `end`
    (or after the units before it, where they end later) on its counts is widened (`widen(unit, pace)`:
    its members on the fewest GPUs, no fewer than their own, at that pace) until it ends by
    then, or keeps the counts on which it ends first. Returns the units so widened and when
    the last of them ends.

    The list schedule is what the policy's in-order start carries out, with estimated times
    (each member leaves when it has trained its samples at the stream's pace).
    """
    free = [0.0] * gpus  # when each GPU comes free, ascending
    out = []
    for unit in units:
        chosen = _earliest_end(unit, free, max(end, free[-1]), widen)
        _lay_out(chosen, free)
        out.append(chosen)
    return out, free[-1]


def _lay_out(unit: Unit, free: list[float]) -> float:
    """Start `unit`'s members in order on the GPUs of `free` that come free first, each as its
    GPUs come free, or all at once when the last of them has (`together`); `free` then holds
    when their GPUs come free again. Returns when its last member ends."""
    if unit.narrowing is not None:  # one model: all its GPUs until it narrows, the narrower count to its end
        start, narrow = free[unit.counts[0] - 1], unit.narrowing
        del free[:unit.counts[0]]
        ends = ((narrow.count, unit.seconds), (unit.counts[0] - narrow.count, unit.wide_seconds + narrow.pause_s))
        for count, seconds in ends:
            for _ in range(count):
                bisect.insort(free, start + seconds)
        return start + unit.seconds
    (start, whole), finish = _first_start(unit, free), 0.0
    for count, samples in zip(unit.counts, unit.samples):
        if not whole:
            start = free[count - 1]
        del free[:count]
        finish = max(finish, start + samples / unit.pace)
        for _ in range(count):
            bisect.insort(free, start + samples / unit.pace)
    return finish


def _first_start(unit: Unit, free: list[float]) -> tuple[float, bool]:
    """When `unit`'s first member starts on the GPUs of `free`, and whether all its members
    start then (`together`)."""
    first = free[unit.counts[0] - 1]
    if unit.gpus <= len(free) and together(unit, len(free), free[unit.gpus - 1] - first):
        return free[unit.gpus - 1], True
    return first, False


def _earliest_end(unit: Unit, free: list[float], end: float, widen: Callable[[Unit, float], Unit]) -> Unit:
    """`unit` or a wider one (see `scheduled`), laid out on a copy of `free`."""
    best, option = None, unit
    while max(option.counts) <= len(free):
        start, _ = _first_start(option, free)
        finish = _lay_out(option, list(free))
        if best is None or finish < best[1]:
            best = (option, finish)
        if finish <= end or start >= end:
            break
        wider = widen(unit, max(unit.samples) / (end - start))
        if wider.gpus <= option.gpus:
            break
        option = wider
    return unit if best is None else best[0]
