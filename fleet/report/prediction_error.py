"""A job's forecast of itself (``forecast.json``) set against what it measured (pure).

Before training, each job simulates its policy on the models left to it and writes the
predicted Gantt to ``forecast.json``: every member's stay on its GPUs, in seconds from the
job's first step. `read_forecast` takes that document (None for a missing, older or
malformed one: the report then leaves the comparison out) and `compare` sets it beside the
job's measured story (`fleet.report.run_story`, the job's events alone):

- the makespans and their ratio;
- per model, seconds per epoch (predicted: its stays' training time over the epochs they
  trained; measured: its epochs' ``epoch_s``, a partly trained epoch counted by its share of
  the samples) and the time from each launch to the first step (start and restore);
- the error ``measured - predicted`` split into sources that add up to it exactly. On either
  side, the GPUs' time ``M x makespan`` is what each stay held (its start, its training, its
  saves and, measured only, whatever else it did: validation, reports, leaving), the time
  GPUs sat idle while some model ran, and the time no model ran at all (planning, the job's
  start and end). Idle GPUs wait for the models still running (a round's straggler, the
  run's last model), so their time is charged to the stays running then, shared by their
  GPUs, and within a stay to its start, training, saves and other work by their shares of
  it. Each category's GPU-seconds, measured less predicted, over the M GPUs, is its source
  in seconds of makespan: one model training 2x slower than predicted while the others
  wait is named as training pace, not as idle GPUs. Training is split further, per model,
  into *pace* (the epochs it trained, at the measured less the predicted GPU-seconds per
  epoch, idle time charged included) and *epochs trained* (epochs more or fewer than
  predicted: early stops, an interrupted job).

What the split cannot tell: the log does not say when inside a stint its GPUs did what, so
idle time is charged to a stay's parts by their shares of the whole stay; nor when inside a
member's start its first epoch began, so an epoch's wall time counts from the first step on
(its overlap with the start is the start's); an epoch's validation is "other work". A
forecast.json without ``launched`` (as this fleet writes it): a stay's launch is taken as the
later of its round's start and the last release of its GPUs before it started (as the
simulator launches, planning taking no time).
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from fleet.report.run_story import RunStory, Stint
from fleet.schedule.rates import is_number

SCHEMA = 1
"""The ``schema`` of forecast.json this reader knows."""

PACE = "training pace"
EPOCHS = "epochs trained"
STARTS = "start and restore"
SAVES = "checkpoints"
OTHER = "validation and other work"
GAPS = "no model running"
SOURCES = (PACE, EPOCHS, STARTS, SAVES, OTHER, GAPS)


@dataclass(frozen=True)
class PredictedStay:
    """A member's predicted stay on `gpus`: launched, trained from `start` to `end`, its GPUs
    released at `released` (after its checkpoint), its epochs going from ``epochs[0]`` to
    ``epochs[1]``."""

    model: str
    round: int
    gpus: tuple[int, ...]
    launched: float
    start: float
    end: float
    released: float
    outcome: str
    epochs: tuple[float, float]


@dataclass(frozen=True)
class Forecast:
    """forecast.json read back: the policy, its makespan and range, the stays and the rounds
    (index, start, end)."""

    policy: str
    makespan_s: float
    range_s: tuple[float, float]
    stays: tuple[PredictedStay, ...]
    rounds: tuple[tuple[int, float, float], ...]


def load_forecast(path: str | os.PathLike) -> Forecast | None:
    """`read_forecast` of the file at `path`; None where it is missing or not JSON."""
    try:
        with open(path, encoding="utf-8") as handle:
            doc = json.load(handle)
    except (OSError, ValueError):
        return None
    return read_forecast(doc)


def read_forecast(doc: object) -> Forecast | None:
    """The forecast in a forecast.json document; None for another schema or a malformed one
    (a missing key, a value of the wrong type, a time that is not finite or runs backwards)."""
    if not isinstance(doc, Mapping) or doc.get("schema") != SCHEMA:
        return None
    try:
        rounds = tuple((_int(r["index"]), _time(r["start"]), _time(r["end"])) for r in _list(doc["rounds"]))
        raw = [_stay(m) for m in _list(doc["members"])]
        low, high = (_time(x) for x in _pair(doc["range_s"]))
        policy, makespan = doc["policy"], _time(doc["makespan_s"])
    except (KeyError, TypeError, ValueError):
        return None
    if not isinstance(policy, str) or any(s is None for s in raw):
        return None
    stays = tuple(_launched(s, raw, rounds) for s in raw)
    return Forecast(policy, makespan, (low, high), stays, rounds)


def _stay(member: object) -> PredictedStay | None:
    """One member of forecast.json; its ``launched`` NaN where the file has none (inferred
    later). Raises KeyError, TypeError or ValueError for a malformed one."""
    if not isinstance(member, Mapping) or not isinstance(member["model"], str):
        raise TypeError("member")
    gpus = tuple(_int(g) for g in _list(member["gpus"]))
    start, end, released = _time(member["start"]), _time(member["end"]), _time(member["released"])
    epochs = tuple(_time(e) for e in _pair(member["epochs"]))
    launched = _time(member["launched"]) if "launched" in member else math.nan
    if not gpus or not start <= end <= released or epochs[1] < epochs[0] or launched > start:
        raise ValueError("member")
    return PredictedStay(member["model"], _int(member["round"]), gpus, launched, start, end, released,
                         str(member["outcome"]), (epochs[0], epochs[1]))


def _launched(stay: PredictedStay, stays: Sequence[PredictedStay],
              rounds: Sequence[tuple[int, float, float]]) -> PredictedStay:
    """`stay` with its launch: the file's, else the later of its round's start and the last
    release of one of its GPUs at or before its start."""
    if not math.isnan(stay.launched):
        return stay
    freed = [o.released for o in stays if o is not stay and set(o.gpus) & set(stay.gpus) and o.released <= stay.start]
    began = [start for index, start, _ in rounds if index == stay.round and start <= stay.start]
    launched = max([0.0, *freed, *began])
    return PredictedStay(stay.model, stay.round, stay.gpus, launched, stay.start, stay.end, stay.released,
                         stay.outcome, stay.epochs)


def _list(value: object) -> list:
    if not isinstance(value, list):
        raise TypeError("list")
    return value


def _pair(value: object) -> list:
    if len(_list(value)) != 2:
        raise ValueError("pair")
    return value


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError("int")
    return value


def _time(value: object) -> float:
    if not is_number(value) or value < 0:
        raise TypeError("time")
    return float(value)


# -- the comparison ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelTimes:
    """One model, predicted against measured: seconds per epoch (None without an epoch on that
    side), epochs, GPU-seconds of training (``train_gpu_s``; ``train_cost_gpu_s`` with the idle
    time charged to it), and its starts (launch to first step), summed over its stays
    (predicted) and stints (measured)."""

    model: str
    predicted_epoch_s: float | None
    measured_epoch_s: float | None
    predicted_epochs: float
    measured_epochs: float
    predicted_train_gpu_s: float
    measured_train_gpu_s: float
    predicted_train_cost_gpu_s: float
    measured_train_cost_gpu_s: float
    predicted_start_s: float
    measured_start_s: float
    predicted_starts: int
    measured_starts: int

    @property
    def predicted_gpu_s_per_epoch(self) -> float | None:
        return self.predicted_train_gpu_s / self.predicted_epochs if self.predicted_epochs > 0 else None

    @property
    def pace(self) -> float | None:
        """Measured over predicted GPU-seconds per epoch (None where a side trained none)."""
        predicted = self.predicted_gpu_s_per_epoch
        if not predicted or self.measured_epochs <= 0:
            return None
        return self.measured_train_gpu_s / self.measured_epochs / predicted

    @property
    def at_predicted_pace_gpu_s(self) -> float:
        """Its measured epochs at the predicted cost per epoch (where a side trained no epoch:
        its measured cost as it was)."""
        if self.predicted_epochs <= 0 or self.measured_epochs <= 0:
            return self.measured_train_cost_gpu_s
        return self.measured_epochs * self.predicted_train_cost_gpu_s / self.predicted_epochs

    @property
    def pace_gpu_s(self) -> float:
        """GPU-seconds its pace cost: its measured training cost less its epochs at the predicted one."""
        return self.measured_train_cost_gpu_s - self.at_predicted_pace_gpu_s

    @property
    def epochs_gpu_s(self) -> float:
        """GPU-seconds of epochs trained beyond the predicted ones, at the predicted cost per
        epoch (negative: fewer)."""
        return self.at_predicted_pace_gpu_s - self.predicted_train_cost_gpu_s


@dataclass(frozen=True)
class Source:
    """A source of the makespan's error: `seconds` of it (GPU-seconds measured less predicted,
    over the GPUs), from the GPU-seconds on each side (idle time charged included)."""

    name: str
    seconds: float
    measured_gpu_s: float
    predicted_gpu_s: float


@dataclass(frozen=True)
class PredictionError:
    """A job's forecast against its measured run (see the module's docstring).

    Attributes:
        forecast: what the job expected.
        gpus: the run's GPUs.
        measured_s: the job's measured makespan (so far, for a running job).
        state: the job's state (``finished``, ``interrupted``, ``killed``, ``running``).
        models: per model, every model of either side, in the forecast's order.
        sources: every source in `SOURCES` order; their seconds add up to the error.
    """

    forecast: Forecast
    gpus: int
    measured_s: float
    state: str
    models: tuple[ModelTimes, ...]
    sources: tuple[Source, ...]

    @property
    def predicted_s(self) -> float:
        return self.forecast.makespan_s

    @property
    def ratio(self) -> float | None:
        """Measured over predicted makespan (None for a forecast of nothing)."""
        return self.measured_s / self.predicted_s if self.predicted_s > 0 else None

    @property
    def largest(self) -> Source:
        """The source of most seconds of error, either way."""
        return max(self.sources, key=lambda s: abs(s.seconds))

    def headline(self) -> str:
        """``measured 33.0 s against 24.2 s predicted (1.36x)``."""
        ratio = f" ({self.ratio:.2f}x)" if self.ratio is not None else ""
        so_far = " so far" if self.state == "running" else ""
        return f"measured {seconds(self.measured_s)}{so_far} against {seconds(self.predicted_s)} predicted{ratio}"

    def sentence(self) -> str:
        """The largest source named in one sentence, with what it was made of."""
        source = self.largest
        error = self.measured_s - self.predicted_s
        return f"{_DESCRIBE[source.name](self, source)} ({seconds(source.seconds, '+')} of the {seconds(error, '+')})"


def seconds(value: float, sign: str = "") -> str:
    """``24.2 s``; two decimals under 10 s (a small run's makespan is a few seconds)."""
    return f"{value:{sign},.2f} s" if abs(value) < 10 else f"{value:{sign},.1f} s"


def last_job(events: Sequence[Mapping]) -> list[Mapping]:
    """The records of the last job in `events` (from its ``run_start`` on): the job
    forecast.json forecast."""
    starts = [k for k, e in enumerate(events) if isinstance(e, Mapping) and e.get("event") == "run_start"]
    return list(events[starts[-1]:]) if starts else []


def forecast_of(forecast: Forecast | None, job: Sequence[Mapping]) -> Forecast | None:
    """`forecast` where it is the one the job in `job` (`last_job`'s records) made: its
    ``run_start`` holds the same makespan. Else None: forecast.json is an earlier job's."""
    start = job[0] if job else {}
    record = start.get("forecast")
    if forecast is None or not isinstance(record, Mapping) or record.get("makespan_s") != forecast.makespan_s:
        return None
    return forecast


def compare(forecast: Forecast, story: RunStory) -> PredictionError | None:
    """`forecast` against `story`, the story of the job that made it alone (its first job
    is that job). None where the forecast puts a model on a GPU the run does not have."""
    if any(g >= story.gpus for s in forecast.stays for g in s.gpus):
        return None
    measured, predicted = _measured(story), _predicted(forecast, story.gpus)
    models = _model_times(forecast, measured, predicted)
    sources = _sources(story.gpus, (story.training_s, forecast.makespan_s), (measured, predicted), models)
    return PredictionError(forecast, story.gpus, story.training_s, story.state, models, sources)


@dataclass(frozen=True)
class _Split:
    """One stay or stint from `begin` to `finish` on `gpus` GPUs: its start, training, saves
    and other work in seconds, the epochs its training covered, and the idle GPU-seconds
    charged to it (`_charged`)."""

    model: str
    gpus: int
    begin: float
    finish: float
    start: float
    train: float
    saves: float
    other: float
    epochs: float
    charged: float = 0.0

    def cost(self, part: str) -> float:
        """GPU-seconds of `part` (``start``, ``train``, ``saves``, ``other``), with its share
        of the idle time charged to the split."""
        length = self.start + self.train + self.saves + self.other
        own = getattr(self, part)
        return own * self.gpus + (self.charged * own / length if length > 0 else 0.0)


def _predicted(forecast: Forecast, gpus: int) -> list[_Split]:
    splits = [_Split(s.model, len(s.gpus), s.launched, s.released, s.start - s.launched, s.end - s.start,
                     s.released - s.end, 0.0, s.epochs[1] - s.epochs[0]) for s in forecast.stays]
    return _charged(splits, gpus, forecast.makespan_s)


def _measured(story: RunStory) -> list[_Split]:
    """Each stint split (see `_stint_split`), in start order, idle time charged."""
    left: dict[str, int] = {}  # where the model's previous stint left its epoch
    epoch_samples = _epoch_samples(story.stints)
    splits = []
    for stint in sorted(story.stints, key=lambda s: s.start):
        splits.append(_stint_split(stint, left.get(stint.model, 0), epoch_samples.get(stint.model, 0)))
        left[stint.model] = stint.left_samples
    return _charged(splits, story.gpus, story.training_s)


def _charged(splits: list[_Split], gpus: int, makespan: float) -> list[_Split]:
    """`splits` with the idle GPU-seconds charged to them: in every span of [0, `makespan`]
    where some split runs, the `gpus` none holds are charged to the running splits by their
    GPUs (a negative charge where measured stints overlap, one leaving as the next starts)."""
    starting: dict[float, list[int]] = defaultdict(list)
    ending: dict[float, list[int]] = defaultdict(list)
    for k, split in enumerate(splits):
        if split.finish > split.begin and split.gpus:
            starting[split.begin].append(k)
            ending[split.finish].append(k)
    cuts = [t for t in sorted({0.0, makespan, *starting, *ending}) if t <= makespan]
    charged, running = [0.0] * len(splits), set()
    for t0, t1 in zip(cuts, cuts[1:]):
        running.difference_update(ending.get(t0, ()))
        running.update(starting.get(t0, ()))
        held = sum(splits[k].gpus for k in running)
        for k in running:
            charged[k] += (gpus - held) * (t1 - t0) * splits[k].gpus / held
    return [replace(s, charged=c) for s, c in zip(splits, charged)]


def _epoch_samples(stints: Sequence[Stint]) -> dict[str, int]:
    """Each model's samples per epoch, from its epoch records."""
    out: dict[str, int] = {}
    for stint in stints:
        for epoch in stint.epochs:
            out[stint.model] = max(out.get(stint.model, 0), epoch.samples)
    return out


def _stint_split(stint: Stint, resumed_at: int, epoch_samples: int) -> _Split:
    """The stint's start (its master's start_s), its saves, its training (each epoch's wall
    time from the first step on, and a last, partly trained epoch up to its final save) and
    the rest; the epochs it trained count a resumed first epoch and a partly trained last one
    by their share of the epoch's samples."""
    length = stint.end - stint.start
    start = min(stint.start_s, length)
    saves = min(sum(e.checkpoint_s for e in stint.epochs) + stint.final_checkpoint_s, length - start)
    stepping = stint.start + start
    train = sum(max(0.0, e.end - max(e.end - e.wall_s, stepping)) for e in stint.epochs)
    epochs = float(len(stint.epochs))
    if stint.epochs and resumed_at and epoch_samples:
        epochs -= min(resumed_at / epoch_samples, 1.0)
    if stint.left_samples and epoch_samples:
        last = max([stepping, *(e.end for e in stint.epochs)])
        train += max(0.0, stint.end - stint.final_checkpoint_s - last)
        epochs += min(stint.left_samples / epoch_samples, 1.0)
    train = min(train, length - start - saves)
    return _Split(stint.model, len(stint.gpus), stint.start, stint.end, start, train, saves,
                  length - start - saves - train, epochs)


def _model_times(forecast: Forecast, measured: list[_Split], predicted: list[_Split]) -> tuple[ModelTimes, ...]:
    names = list(dict.fromkeys([s.model for s in forecast.stays] + [s.model for s in measured]))
    return tuple(_one_model(name, [s for s in predicted if s.model == name], [s for s in measured if s.model == name])
                 for name in names)


def _one_model(name: str, predicted: list[_Split], measured: list[_Split]) -> ModelTimes:
    def per_epoch(splits: list[_Split]) -> float | None:
        epochs = sum(s.epochs for s in splits)
        return sum(s.train for s in splits) / epochs if epochs > 0 else None

    return ModelTimes(
        name, per_epoch(predicted), per_epoch(measured), sum(s.epochs for s in predicted),
        sum(s.epochs for s in measured), sum(s.train * s.gpus for s in predicted),
        sum(s.train * s.gpus for s in measured), sum(s.cost("train") for s in predicted),
        sum(s.cost("train") for s in measured), sum(s.start for s in predicted), sum(s.start for s in measured),
        len(predicted), len(measured))


def _sources(gpus: int, spans: tuple[float, float], sides: tuple[list[_Split], list[_Split]],
             models: Sequence[ModelTimes]) -> tuple[Source, ...]:
    """Every source's GPU-seconds on each side (measured, predicted: their makespans `spans`
    and splits `sides`), and its seconds of the error."""
    def cost(part: str) -> tuple[float, float]:
        return tuple(sum(s.cost(part) for s in side) for side in sides)

    def gaps(makespan: float, side: list[_Split]) -> float:
        return gpus * makespan - sum((s.finish - s.begin) * s.gpus + s.charged for s in side)

    totals = {
        PACE: (sum(m.measured_train_cost_gpu_s for m in models), sum(m.at_predicted_pace_gpu_s for m in models)),
        EPOCHS: (sum(m.at_predicted_pace_gpu_s for m in models), sum(m.predicted_train_cost_gpu_s for m in models)),
        STARTS: cost("start"), SAVES: cost("saves"), OTHER: cost("other"),
        GAPS: (gaps(spans[0], sides[0]), gaps(spans[1], sides[1])),
    }
    return tuple(Source(name, (m - p) / gpus, m, p) for name, (m, p) in totals.items())


# -- the sentence naming the largest source -----------------------------------------------------


def _most(items: Sequence[tuple[str, float, str]], sign: float, count: int = 3) -> str:
    """`` (most: a 2.1x, b 1.9x)``: the names of the `count` items of largest weight of `sign`."""
    named = sorted((i for i in items if i[1] * sign > 0), key=lambda i: -abs(i[1]))[:count]
    return f" (most: {', '.join(f'{name} {text}' for name, _, text in named)})" if named else ""


def _describe_pace(error: PredictionError, source: Source) -> str:
    """The GPU-seconds per epoch, measured over predicted, of every model that trained on both
    sides; the models named are those whose pace cost most (idle time charged included)."""
    paced = [m for m in error.models if m.pace is not None]
    planned = sum(m.measured_epochs * m.predicted_gpu_s_per_epoch for m in paced)
    ratio = sum(m.measured_train_gpu_s for m in paced) / planned if planned > 0 else 1.0
    most = _most([(m.model, m.pace_gpu_s, f"{m.pace:.1f}x") for m in paced], source.seconds)
    return f"{PACE}: epochs took {ratio:.2f}x the predicted time{most}"


def _describe_epochs(error: PredictionError, source: Source) -> str:
    measured = sum(m.measured_epochs for m in error.models)
    predicted = sum(m.predicted_epochs for m in error.models)
    most = _most([(m.model, m.epochs_gpu_s, f"{m.measured_epochs:g} of {m.predicted_epochs:g}")
                  for m in error.models], source.seconds)
    return f"{EPOCHS}: {measured:.1f} model-epochs trained against {predicted:.1f} predicted{most}"


def _describe_starts(error: PredictionError, source: Source) -> str:
    count = sum(m.measured_starts for m in error.models)
    measured = sum(m.measured_start_s for m in error.models) / max(count, 1)
    predicted = sum(m.predicted_start_s for m in error.models) / max(sum(m.predicted_starts for m in error.models), 1)
    most = _most([(m.model, m.measured_start_s - m.predicted_start_s, f"{m.measured_start_s:.1f} s")
                  for m in error.models], source.seconds)
    return (f"{STARTS}: {count} starts took {measured:.2f} s each from launch to first step, "
            f"{predicted:.2f} s predicted{most}")


def _describe_gpu_s(what: str) -> Callable[[PredictionError, Source], str]:
    def describe(error: PredictionError, source: Source) -> str:
        return (f"{source.name}: {source.measured_gpu_s:,.1f} GPU-s {what} against "
                f"{source.predicted_gpu_s:,.1f} predicted")
    return describe


_DESCRIBE = {
    PACE: _describe_pace, EPOCHS: _describe_epochs, STARTS: _describe_starts,
    SAVES: _describe_gpu_s("saving checkpoints (GPUs idle meanwhile included)"),
    OTHER: _describe_gpu_s("outside start, steps and saves (validation, reports, leaving)"),
    GAPS: _describe_gpu_s("with no model running (planning, the job's start and end)"),
}
