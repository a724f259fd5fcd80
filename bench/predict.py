"""Predictions users can trust (issue 45): each run's forecast against its measured makespan, and `policy: auto`'s pick.

What: every policy runs as its own `fleet run` on four cases, in one invocation:

- (a) the 32-model sweep of `bench/peers.py` (8 CNN architectures x `--a-sweep` learning
  rates, its synthetic JPEGs of 96 px trained at 24 px, its transforms and spec) on 1 node of
  `--a-slots` CPU trainer slots (default 4) + 1 preprocessor, by default on 1,500 JPEGs for 1
  epoch (`--a-samples 3000 --a-epochs 2`: peers.py's own size, about 3x the time);
  `--a-device cuda` runs it on a GPU (on a lent one: `--cases a --a-device cuda --a-slots 1`);
- (b) the quickstart, `examples/quickstart.yaml` (10 nets of five families, 3 CPU slots + 1
  preprocessor, its stop rule) on the data `make demo` makes (2,400 JPEGs of 20 px;
  `--b-samples`), by default for at most 2 epochs (`--b-epochs 4`: as shipped, where its stop
  rule may end models early; about 10 minutes more);
- (c) 16 trainers, `--c-nodes` virtual nodes x `--c-slots` trainer slots (default 4 x 4) + 1
  preprocessor per node, `device: emulated` (a step sleeps for the time the profile gives its
  model and group; the data path is real), on (a)'s ensemble and data with (c)'s own sizes.
  The emulated device takes its rates from a profile, measured once on 1 node of `--c-slots`
  CPU slots (the one of (a) when the two specs agree): (c) runs with a profile only;
- (d) partitioned data: (a)'s 8 architectures (x `--d-sweep`) on a synthetic HDF5 data set
  of 16 px cut into 2 partitions, one per virtual node (2 nodes x `--d-slots` CPU trainer
  slots + 1 preprocessor each), as `bench/mop.py --runtime` partitions its data; the policies
  of partitioned data only, `mop` and `fleet-hop` (`--policies` does not apply).

Every model trains for exactly its `max_epochs` in (a), (c) and (d) (their stop rule is
switched off); the quickstart keeps its stop rule (`patience: 2`, which cannot end a model
within 2 epochs).

Each (case, policy) runs in two rate modes (`--profile both`, the default): "measured", with
a profile (`fleet profile` once per case, its profile.json copied into each run directory,
which the run reuses, as `bench/e2e_cpu.py` does), and "estimated", from a fresh run directory
with `scheduler.profile: auto`, which judges a profile too dear beside such short training: the
rates are estimated from FLOPs and corrected by a few timed steps per model family before
training (the console and results.json's `prediction.rates` say which). `--profile yes` or
`no`: one of them; `--pilot S`: the profile is made with `fleet profile --pilot S` (a short
real run whose measured costs calibrate every prediction from that profile; (c)'s emulated runs
ignore its CPU pilot). `--profile all` adds "calibrated": the measured mode's profile plus
`--calibrate-from` this round's measured run of the case's first policy (the costs and rates
an earlier run of the same models measured; for the other policies, learned under another).
Besides the named policies, `policy: auto` runs in each case and mode.

How: `--rounds` rounds (default 3), alternating: round 1 runs every (case, mode, policy) once,
then round 2 does, so drift in the machine's load falls on all of them; figures are medians
over the rounds. Per run, from its results.json: `prediction.makespan_s` (the run's forecast
of itself: the simulation the dry run makes, on the rates it plans with) and its p10-p90 range,
the measured `makespan_s` (first step to last), their ratio, and the wall seconds of `fleet run`
from launch to exit (start-up and shutdown included). A run's predicted wall time is
results.json's `prediction.wall_s` where it has one ("-" otherwise).

Printed: one table per case (rows: policy x mode; medians over rounds: predicted makespan,
its range, measured makespan and each round's, measured / predicted and whether it lies within
0.85-1.15, wall seconds, predicted wall seconds); per case and mode, the policy `auto` picked
(in how many rounds) against the named policy that measured fastest (median makespan), with the
pick's median over the fastest one's and whether it is within 5 %; then a summary line: how
many (case, policy, mode) of the named policies are within 0.85-1.15. Issue 45's targets: every
ratio within 0.85-1.15 on (a)-(d) in both modes; `auto`'s pick the fastest, or within 5 % of it,
in (a) and (b).

`--keep DIR` keeps the data, the profiles and every run directory (data made there before is
reused); `--json FILE` writes the settings, every run's figures and the medians.

Time: the default invocation (4 cases, 5 policies + auto, both modes, 3 rounds: 108 runs and
3 profiles, (c) planning with (a)'s) should take about 40 minutes on a quiet 2-core VM, most
of it (a) and (b); `--rounds 1` about 15. That is an estimate from the parts' single runs
(about 10 s of fleet's start-up and shutdown per run, 20 s for (c)'s 20 ranks), not a
measured figure.

Usage: .venv/bin/python bench/predict.py [--cases a,b,c,d] [--policies fleet-g,fleet-l,fleet-adaptive,
       homogeneous,baseline] [--rounds 3] [--profile both|yes|no|all] [--pilot S] [--timeout 1200] [--keep DIR]
       [--json FILE]
       [--a-sweep 4] [--a-epochs 1] [--a-samples 1500] [--a-slots 4] [--a-device cpu|cuda]
       [--b-samples 2400] [--b-epochs 2]
       [--c-sweep 4] [--c-epochs 1] [--c-samples 1500] [--c-nodes 4] [--c-slots 4]
       [--d-sweep 1] [--d-epochs 2] [--d-samples 2000] [--d-slots 2]
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

import yaml

from fleet.spec import parse_spec

from _harness import at_least, fleet, fleet_run, jpeg_folder, name_list, work_dir
from peers import fresh_dir, write_spec

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "examples" / "quickstart.yaml"
CASES = ("a", "b", "c", "d")
POLICIES = ("fleet-g", "fleet-l", "fleet-adaptive", "homogeneous", "baseline")
HOPPING = ("mop", "fleet-hop")  # (d)'s policies: the only ones of partitioned data
AUTO = "auto"
MEASURED, ESTIMATED, CALIBRATED = "measured", "estimated", "calibrated"  # the rate modes (see the docstring)
PROFILE_MODES = {"both": (MEASURED, ESTIMATED), "yes": (MEASURED,), "no": (ESTIMATED,),
                 "all": (MEASURED, ESTIMATED, CALIBRATED)}
BAND = (0.85, 1.15)  # issue 45: measured / predicted makespan within this
NEAR = 0.05  # issue 45: auto's pick within 5 % of the fastest policy's makespan
SOURCE_SIZE, IMAGE_SIZE = 96, 24  # (a) and (c): peers.py's light setting
QUICKSTART_IMAGE = 20  # the side of the JPEGs `make demo` writes
PARTITIONS, PARTITIONED_IMAGE = 2, 16  # (d)


# ----------------------------------------------------------------------------- the cases


@dataclass(frozen=True)
class Case:
    """One setting every policy runs on.

    Attributes:
        key: a, b, c or d.
        title: what it is, for the table's heading.
        spec: the spec document (its `scheduler.policy` is set per run).
        policies: the named policies it runs (`auto` runs besides them).
        modes: the rate modes it runs in.
        profile_spec: the spec `fleet profile` measures the rates of the measured mode on.
        note: what the table should say besides (one line, or "").
    """

    key: str
    title: str
    spec: dict
    policies: tuple[str, ...]
    modes: tuple[str, ...]
    profile_spec: dict
    note: str = ""


def sweep_spec(folder: Path, data: Path, sweep: int, epochs: int, slots: int) -> dict:
    """peers.py's spec (`write_spec`: e2e_cpu's data, transforms and models, `patience: 1000`)
    for `sweep` learning rates, `epochs` epochs and 1 node of `slots` CPU slots + 1 preprocessor."""
    setting = SimpleNamespace(slots=slots, preprocessors=1, threads=1, sweep=sweep, epochs=epochs,
                              image_size=IMAGE_SIZE)
    folder.mkdir(parents=True, exist_ok=True)
    return yaml.safe_load(write_spec(folder, data, setting).read_text())


def sweep_data(root: Path, samples: int) -> Path:
    """(a)'s and (c)'s JPEG folder (made once per sample count)."""
    return jpeg_folder(root / f"images-{samples}x{SOURCE_SIZE}px", samples, SOURCE_SIZE)


def case_a(root: Path, args, modes: tuple[str, ...]) -> Case:
    doc = sweep_spec(root / "a", sweep_data(root, args.a_samples), args.a_sweep, args.a_epochs, args.a_slots)
    doc["cluster"]["device"] = args.a_device
    doc["name"] = "predict-a"
    kind = "GPU" if args.a_device == "cuda" else "CPU"
    title = (f"(a) {len(doc['models'])} models (8 CNNs x {args.a_sweep} learning rate(s)) x {args.a_epochs} "
             f"epoch(s) on {args.a_samples:,} JPEGs ({SOURCE_SIZE} px, trained at {IMAGE_SIZE}), 1 node x "
             f"{args.a_slots} {kind} slot(s) + 1 preprocessor")
    return Case("a", title, doc, tuple(args.policies), modes, doc)


def case_b(root: Path, args, modes: tuple[str, ...]) -> Case:
    doc = yaml.safe_load(QUICKSTART.read_text())
    data = jpeg_folder(root / f"quickstart-{args.b_samples}x{QUICKSTART_IMAGE}px", args.b_samples, QUICKSTART_IMAGE)
    doc["data"]["path"] = str(data)
    doc["train"]["max_epochs"] = args.b_epochs
    doc["name"] = "predict-b"
    cluster = doc["cluster"]
    title = (f"(b) the quickstart: {len(parse_spec(doc).models)} models x at most {args.b_epochs} epoch(s), "
             f"its stop rule, on {args.b_samples:,} JPEGs ({QUICKSTART_IMAGE} px), {cluster['nodes']} node x "
             f"{cluster['gpus_per_node']} CPU slots + {cluster['preprocessors_per_node']} preprocessor")
    return Case("b", title, doc, tuple(args.policies), modes, doc)


def case_c(root: Path, args, modes: tuple[str, ...]) -> Case:
    cpu = sweep_spec(root / "c", sweep_data(root, args.c_samples), args.c_sweep, args.c_epochs, args.c_slots)
    cpu["name"] = "predict-a"  # the CPU twin: the same document as (a)'s when the sizes agree (one profile)
    doc = copy.deepcopy(cpu)
    doc["name"] = "predict-c"
    doc["cluster"].update(nodes=args.c_nodes, virtual_nodes=True, device="emulated")
    trainers = args.c_nodes * args.c_slots
    title = (f"(c) {trainers} emulated trainers, {args.c_nodes} virtual nodes x {args.c_slots} slots + 1 "
             f"preprocessor each: {len(doc['models'])} models (8 CNNs x {args.c_sweep}) x {args.c_epochs} epoch(s) "
             f"on {args.c_samples:,} JPEGs")
    note = (f"(c) runs with a profile only: the emulated device's steps take the times of the profile measured once "
            f"on 1 node x {args.c_slots} CPU slots")
    return Case("c", title, doc, tuple(args.policies), tuple(m for m in modes if m != ESTIMATED), cpu, note)


def partitioned_data(root: Path, samples: int, timeout: float) -> Path:
    """(d)'s data: a synthetic HDF5 set cut into `PARTITIONS` partitions (made once per sample
    count; a folder this made before holds a `.made` mark)."""
    folder = root / f"partitioned-{samples}x{PARTITIONED_IMAGE}px"
    parts = folder / "parts"
    if not (folder / ".made").exists():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        whole = folder / "all.h5"
        fleet("data", "make", "synthetic", "--format", "hdf5", "--out", str(whole), "--samples", str(samples),
              "--image-size", str(PARTITIONED_IMAGE), "--classes", "10", "--quiet", timeout=timeout)
        fleet("data", "partition", "--in", str(whole), "--parts", str(PARTITIONS), "--out", str(parts), "--quiet",
              timeout=timeout)
        (folder / ".made").touch()
    return parts


def case_d(root: Path, args, modes: tuple[str, ...]) -> Case:
    parts = partitioned_data(root, args.d_samples, args.timeout)
    doc = sweep_spec(root / "d", parts, args.d_sweep, args.d_epochs, args.d_slots)
    doc["data"] = {"source": "hdf5", "path": str(parts), "partitioned": True, "image_size": PARTITIONED_IMAGE,
                   "val_fraction": 0.1}
    del doc["preprocess"]  # the JPEG transforms: the HDF5 images train as they are
    doc["name"] = "predict-d"
    doc["cluster"].update(nodes=PARTITIONS, virtual_nodes=True)
    title = (f"(d) partitioned data: {len(doc['models'])} models (8 CNNs x {args.d_sweep}) x {args.d_epochs} epoch(s) "
             f"on {args.d_samples:,} HDF5 images ({PARTITIONED_IMAGE} px) in {PARTITIONS} partitions, {PARTITIONS} "
             f"virtual nodes x {args.d_slots} CPU slots + 1 preprocessor each")
    return Case("d", title, doc, HOPPING, modes, doc)


BUILDERS = {"a": case_a, "b": case_b, "c": case_c, "d": case_d}


# ----------------------------------------------------------------------------- profiles and runs


@dataclass(frozen=True)
class Measured:
    """One `fleet run`: its forecast (results.json's `prediction`) beside what it measured.

    Attributes:
        case, policy, mode, round: which run (`policy` as the spec named it, `auto` too).
        predicted_s: the forecast's makespan (None: results.json has no prediction).
        range_s: the forecast's 10th and 90th percentiles (empty without a prediction).
        measured_s: results.json's `makespan_s`, first step to last.
        wall_s: `fleet run` from launch to exit.
        predicted_wall_s: the forecast's `wall_s` (None where results.json has none).
        rates: where the run's rates came from (the prediction's `rates`).
        ran: the policy that finished the job (results.json's `policy`).
        chosen: under `policy: auto`, the candidate it chose (else None).
        candidates: under `policy: auto`, each candidate's predicted makespan.
        switches: how many times a running `auto` job changed its policy.
        overhead_s: results.json's `overhead_s` (launch, start-up, report, shutdown, ...).
    """

    case: str
    policy: str
    mode: str
    round: int
    predicted_s: float | None
    range_s: tuple[float, ...]
    measured_s: float
    wall_s: float
    predicted_wall_s: float | None
    rates: str
    ran: str
    chosen: str | None = None
    candidates: dict = field(default_factory=dict)
    switches: int = 0
    overhead_s: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        """Measured over predicted makespan (None without a prediction)."""
        return None if not self.predicted_s else self.measured_s / self.predicted_s


def measured_from(results: dict, wall_s: float, case: str, policy: str, mode: str, round_: int) -> Measured:
    """A `Measured` from a run's results.json and its wall seconds."""
    prediction = results.get("prediction") or {}
    choice = results.get("policy_choice") or {}
    return Measured(case=case, policy=policy, mode=mode, round=round_, predicted_s=prediction.get("makespan_s"),
                    range_s=tuple(prediction.get("range_s") or ()), measured_s=results["makespan_s"], wall_s=wall_s,
                    predicted_wall_s=prediction.get("wall_s"), rates=prediction.get("rates", ""),
                    ran=results["policy"], chosen=choice.get("chosen"),
                    candidates=dict(choice.get("predicted_makespan_s") or {}),
                    switches=len(choice.get("switched") or ()), overhead_s=results.get("overhead_s", {}))


def run_spec(case: Case, policy: str, mode: str) -> dict:
    """The case's spec with `scheduler.policy: policy`; in the estimated mode `scheduler.profile:
    auto` (where it judges a profile too dear: rates estimated from FLOPs, corrected by a few
    timed steps per family), in the others `true` (the copied profile reused)."""
    doc = copy.deepcopy(case.spec)
    doc["scheduler"] = {**doc.get("scheduler", {}), "policy": policy, "profile": True if mode != ESTIMATED else "auto"}
    doc["name"] = f"{doc['name']}-{policy}-{mode}"
    return doc


def profile_once(case: Case, root: Path, timeout: float, known: dict[str, tuple[Path, float]],
                 pilot: float | None = None) -> tuple[Path, float]:
    """`fleet profile` on the case's profile spec (with a `pilot` of that many seconds): the
    profile.json path and the profiler's seconds; a spec profiled before in this invocation
    (`known`, by its document) is not again."""
    key = json.dumps(case.profile_spec, sort_keys=True)
    if key not in known:
        spec_path = root / case.key / "profile.yaml"
        spec_path.parent.mkdir(parents=True, exist_ok=True)  # (b) has no folder before
        spec_path.write_text(yaml.safe_dump(case.profile_spec))
        run_dir = fresh_dir(root / case.key / "profile")
        fleet("profile", str(spec_path), "--run-dir", str(run_dir), "--quiet",
              *(("--pilot", f"{pilot:g}") if pilot else ()), timeout=timeout, what=f"fleet profile ({case.key})")
        path = run_dir / "profile.json"
        known[key] = (path, json.loads(path.read_text())["profiler"]["seconds"])
    return known[key]


def run_one(case: Case, policy: str, mode: str, round_: int, root: Path, profile: Path | None, timeout: float) -> Measured:
    """One `fleet run` of the case under `policy` in `mode`, from a fresh run directory (the
    case's profile.json copied in for the measured and calibrated modes; the calibrated one
    also learns from this round's measured run of the case's first policy)."""
    label = f"{policy}-{mode}"
    spec_path = root / case.key / f"{label}.yaml"
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(yaml.safe_dump(run_spec(case, policy, mode)))
    run_dir = fresh_dir(root / case.key / f"{label}-round{round_}")
    if mode != ESTIMATED:
        shutil.copy(profile, run_dir / "profile.json")
    options = ("--calibrate-from", str(root / case.key / f"{case.policies[0]}-{MEASURED}-round{round_}")) \
        if mode == CALIBRATED else ()
    run = fleet_run(spec_path, run_dir, timeout, *options, what=f"fleet run ({case.key}, {policy}, {mode} rates)")
    if mode != ESTIMATED and (run_dir / "profile.json").read_bytes() != Path(profile).read_bytes():
        print(f"note: ({case.key}) {policy} profiled again instead of reusing the copied profile", flush=True)
    return measured_from(run.results, run.wall_s, case.key, policy, mode, round_)


def run_rounds(cases: list[Case], profiles: dict[str, Path], root: Path, args) -> list[Measured]:
    """Every (case, mode, policy) once per round, `--rounds` rounds; a line per run as it ends."""
    runs = []
    for round_ in range(1, args.rounds + 1):
        for case in cases:
            for mode in case.modes:
                for policy in (*case.policies, AUTO):
                    one = run_one(case, policy, mode, round_, root, profiles.get(case.key), args.timeout)
                    runs.append(one)
                    print(f"round {round_}: ({case.key}) {policy:<14} {mode:<9} predicted {fmt(one.predicted_s)} s, "
                          f"measured {one.measured_s:.1f} s, wall {one.wall_s:.1f} s"
                          + (f", chose {one.chosen}" if one.chosen else ""), flush=True)
    return runs


# ----------------------------------------------------------------------------- medians and verdicts (pure)


@dataclass(frozen=True)
class Row:
    """A (case, policy, mode) over its rounds: medians, and each round's measured makespan."""

    case: str
    policy: str
    mode: str
    predicted_s: float | None
    range_s: tuple[float, ...]
    measured_s: float
    measured_each_s: tuple[float, ...]
    ratio: float | None
    wall_s: float
    predicted_wall_s: float | None
    picks: tuple[str, ...] = ()  # auto's rows: the candidate it chose in each round

    @property
    def within(self) -> bool | None:
        """Whether measured / predicted lies within `BAND` (None without a prediction)."""
        return None if self.ratio is None else BAND[0] <= self.ratio <= BAND[1]


def median_or_none(values: list[float | None]) -> float | None:
    """The median of the values, or None when any is None (a figure some round lacks)."""
    return None if not values or any(v is None for v in values) else statistics.median(values)


def median_range(ranges: list[tuple[float, ...]]) -> tuple[float, ...]:
    """Each end's median over rounds (empty when some round has no range)."""
    if not ranges or any(len(r) != 2 for r in ranges):
        return ()
    return statistics.median(r[0] for r in ranges), statistics.median(r[1] for r in ranges)


def summarize(runs: list[Measured]) -> list[Row]:
    """One `Row` per (case, policy, mode), in the order the runs first came."""
    groups: dict[tuple[str, str, str], list[Measured]] = {}
    for run in runs:
        groups.setdefault((run.case, run.policy, run.mode), []).append(run)
    return [Row(case=case, policy=policy, mode=mode, predicted_s=median_or_none([r.predicted_s for r in group]),
                range_s=median_range([r.range_s for r in group]),
                measured_s=statistics.median(r.measured_s for r in group),
                measured_each_s=tuple(r.measured_s for r in group), ratio=median_or_none([r.ratio for r in group]),
                wall_s=statistics.median(r.wall_s for r in group),
                predicted_wall_s=median_or_none([r.predicted_wall_s for r in group]),
                picks=tuple(r.chosen for r in group if r.chosen))
            for (case, policy, mode), group in groups.items()]


@dataclass(frozen=True)
class AutoVerdict:
    """`policy: auto`'s pick in one case and mode against the named policy that measured fastest.

    Attributes:
        pick: the candidate auto chose in most rounds (the first chosen on a tie).
        rounds_picked: in how many rounds it chose `pick`, of `rounds`.
        fastest: the named policy with the smallest median makespan.
        fastest_s: its median makespan.
        pick_s: the median makespan of `pick` run by name (None: it was not run by name).
        auto_s: the median makespan of the `auto` runs themselves.
    """

    case: str
    mode: str
    pick: str
    rounds_picked: int
    rounds: int
    fastest: str
    fastest_s: float
    pick_s: float | None
    auto_s: float

    @property
    def over_fastest(self) -> float | None:
        """The pick's median makespan over the fastest policy's (None: pick not run by name)."""
        return None if self.pick_s is None else self.pick_s / self.fastest_s

    @property
    def near(self) -> bool | None:
        """Whether the pick is the fastest policy or within `NEAR` of it (None: not run by name)."""
        ratio = self.over_fastest
        return None if ratio is None else self.pick == self.fastest or ratio <= 1 + NEAR


def auto_verdicts(rows: list[Row]) -> list[AutoVerdict]:
    """Per (case, mode) with an `auto` row and named rows: auto's pick against the fastest."""
    verdicts = []
    for auto in (row for row in rows if row.policy == AUTO and row.picks):
        named = {r.policy: r for r in rows if (r.case, r.mode) == (auto.case, auto.mode) and r.policy != AUTO}
        if not named:
            continue
        pick, picked = Counter(auto.picks).most_common(1)[0]
        fastest = min(named.values(), key=lambda r: r.measured_s)
        pick_s = named[pick].measured_s if pick in named else None
        verdicts.append(AutoVerdict(auto.case, auto.mode, pick, picked, len(auto.picks), fastest.policy,
                                    fastest.measured_s, pick_s, auto.measured_s))
    return verdicts


def within_count(rows: list[Row]) -> tuple[int, int]:
    """How many rows of named policies have measured / predicted within `BAND`, of how many."""
    named = [row for row in rows if row.policy != AUTO]
    return sum(1 for row in named if row.within), len(named)


# ----------------------------------------------------------------------------- the report


def fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def verdict_word(ok: bool | None) -> str:
    return "-" if ok is None else ("yes" if ok else "no")


def row_line(row: Row) -> str:
    name = f"auto ({'/'.join(sorted(set(row.picks)))})" if row.policy == AUTO else row.policy
    spread = "-" if not row.range_s else f"{row.range_s[0]:.1f}-{row.range_s[1]:.1f}"
    each = ", ".join(f"{s:.1f}" for s in row.measured_each_s)
    return (f"{name:<26}{row.mode:<11}{fmt(row.predicted_s):>11}{spread:>15}{row.measured_s:>11.1f}  {each:<22}"
            f"{fmt(row.ratio, '.2f'):>7}{verdict_word(row.within):>14}{row.wall_s:>9.1f}{fmt(row.predicted_wall_s):>18}")


def verdict_line(verdict: AutoVerdict) -> str:
    against = ("not run by name" if verdict.pick_s is None else
               f"{verdict.pick} {verdict.pick_s:.1f} s, {100 * (verdict.over_fastest - 1):+.1f} % over the fastest")
    return (f"auto, {verdict.mode} rates: picked {verdict.pick} ({verdict.rounds_picked} of {verdict.rounds} rounds); "
            f"fastest measured {verdict.fastest} {verdict.fastest_s:.1f} s; {against}; within {100 * NEAR:.0f} %: "
            f"{verdict_word(verdict.near)}; auto's own runs {verdict.auto_s:.1f} s")


def print_case(case: Case, rows: list[Row], verdicts: list[AutoVerdict], profile_s: float | None) -> None:
    profiled = "" if profile_s is None else f"; profiled once in {profile_s:.1f} s"
    print(f"\n{case.title}{profiled}")
    if case.note:
        print(case.note)
    print(f"{'policy':<26}{'rates':<11}{'predicted s':>11}{'p10-p90 s':>15}{'measured s':>11}  {'each round s':<22}"
          f"{'ratio':>7}{f'in {BAND[0]}-{BAND[1]}':>14}{'wall s':>9}{'predicted wall s':>18}")
    for row in (row for row in rows if row.case == case.key):
        print(row_line(row))
    for verdict in (v for v in verdicts if v.case == case.key):
        print(verdict_line(verdict))


def print_report(cases: list[Case], rows: list[Row], verdicts: list[AutoVerdict], profile_s: dict) -> None:
    for case in cases:
        print_case(case, rows, verdicts, profile_s.get(case.key))
    within, total = within_count(rows)
    print(f"\nmeasured / predicted makespan within {BAND[0]}-{BAND[1]}: {within} of {total} (case, policy, rates) "
          f"(medians over rounds; auto's rows not counted)")
    print("predicted: results.json's prediction.makespan_s, the run's forecast (the dry run's simulation); measured: "
          "makespan_s, first step to last; wall: fleet run from launch to exit; predicted wall: prediction.wall_s")


# ----------------------------------------------------------------------------- main


def add_size_arguments(parser: argparse.ArgumentParser) -> None:
    """Each case's sizes."""
    parser.add_argument("--a-sweep", type=int, default=4, choices=range(1, 5), help="(a): learning rates per architecture")
    parser.add_argument("--a-epochs", type=at_least(1), default=1)
    parser.add_argument("--a-samples", type=at_least(20), default=1500, help="(a): JPEGs (peers.py: 3000)")
    parser.add_argument("--a-slots", type=at_least(1), default=4, help="(a): trainer slots")
    parser.add_argument("--a-device", choices=("cpu", "cuda"), default="cpu", help="(a): its trainers' device")
    parser.add_argument("--b-samples", type=at_least(20), default=2400, help="(b): JPEGs (make demo's 2,400)")
    parser.add_argument("--b-epochs", type=at_least(1), default=2, help="(b): max_epochs (as shipped: 4)")
    parser.add_argument("--c-sweep", type=int, default=4, choices=range(1, 5), help="(c): learning rates per architecture")
    parser.add_argument("--c-epochs", type=at_least(1), default=1)
    parser.add_argument("--c-samples", type=at_least(20), default=1500, help="(c): JPEGs")
    parser.add_argument("--c-nodes", type=at_least(1), default=4, help="(c): virtual nodes")
    parser.add_argument("--c-slots", type=at_least(1), default=4, help="(c): emulated trainer slots per node")
    parser.add_argument("--d-sweep", type=int, default=1, choices=range(1, 5), help="(d): learning rates per architecture")
    parser.add_argument("--d-epochs", type=at_least(1), default=2)
    parser.add_argument("--d-samples", type=at_least(20), default=2000, help="(d): HDF5 images, over 2 partitions")
    parser.add_argument("--d-slots", type=at_least(1), default=2, help="(d): CPU trainer slots per node")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=name_list(CASES, "case"), default=list(CASES), help="comma-separated, from a,b,c,d")
    parser.add_argument("--policies", type=name_list(POLICIES, "policy"), default=list(POLICIES),
                        help=f"comma-separated, from {','.join(POLICIES)} (not (d): always mop and fleet-hop)")
    parser.add_argument("--rounds", type=at_least(1), default=3, help="rounds, alternating; figures are medians")
    parser.add_argument("--profile", choices=tuple(PROFILE_MODES), default="both",
                        help="rates: measured by a profile (yes), estimated (no), both, or all (both and "
                             "calibrated by an earlier run)")
    parser.add_argument("--pilot", type=float, metavar="SECONDS",
                        help="profile with fleet profile --pilot SECONDS: the measured and calibrated modes then "
                             "predict with the pilot run's measures (a run on another device ignores them)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds one fleet command may take")
    parser.add_argument("--keep", metavar="DIR", help="keep the data, profiles and every run directory in DIR")
    parser.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    add_size_arguments(parser)
    return parser.parse_args()


def prepare(root: Path, args) -> tuple[list[Case], dict[str, Path], dict[str, float]]:
    """The cases that have a mode to run in, and the profile (and its seconds) of each that
    runs in the measured mode."""
    modes = PROFILE_MODES[args.profile]
    cases = [BUILDERS[key](root, args, modes) for key in args.cases]
    for case in (case for case in cases if not case.modes):
        print(f"({case.key}) skipped: {case.note}", flush=True)
    cases = [case for case in cases if case.modes]
    known: dict[str, tuple[Path, float]] = {}
    profiles, seconds = {}, {}
    for case in (case for case in cases if MEASURED in case.modes or CALIBRATED in case.modes):
        before = len(known)
        profiles[case.key], seconds[case.key] = profile_once(case, root, args.timeout, known, args.pilot)
        shared = next(key for key, path in profiles.items() if path == profiles[case.key])
        print(f"({case.key}) profiled in {seconds[case.key]:.1f} s" if len(known) > before else
              f"({case.key}) plans with ({shared})'s profile (the same CPU spec)", flush=True)
    return cases, profiles, seconds


def main() -> None:
    args = parse_args()
    with work_dir(args.keep) as root:
        cases, profiles, profile_s = prepare(root, args)
        runs = run_rounds(cases, profiles, root, args)
    rows = summarize(runs)
    verdicts = auto_verdicts(rows)
    print_report(cases, rows, verdicts, profile_s)
    if args.json:
        within, total = within_count(rows)
        record = {"settings": vars(args), "profile_s": profile_s, "runs": [asdict(run) for run in runs],
                  "rows": [{**asdict(row), "within": row.within} for row in rows],
                  "auto": [{**asdict(v), "over_fastest": v.over_fastest, "near": v.near} for v in verdicts],
                  "within": {"count": within, "of": total, "band": BAND}}
        Path(args.json).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
