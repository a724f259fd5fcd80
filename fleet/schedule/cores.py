"""A CPU node's cores, shared by its trainers and preprocessors (pure).

On a GPU node a trainer's steps run on its own GPU; on a CPU node every trainer and every
preprocessor of the node runs on the same cores, and when together they want more than the
node has, each goes slower. The simulator models that as processor sharing: at any instant a
node's load is the cores its running work would use at the paces the streams would move at
alone, and where the load passes the node's cores every stream on the node slows by the ratio.

Each kind of work costs core-seconds per sample:

- a member training on ``m`` trainers at the rate ``r`` the rate table gives (its rate with
  the node to itself) uses ``m * trainer_cores`` cores at that rate, so ``m * trainer_cores / r``
  core-seconds per sample of its stream, plus ``trainer_overhead_s`` for what a trainer does
  outside its steps (receiving chunks, assembling batches); each trainer of a group pays
  ``group_overhead_s`` per sample of the stream (its share of the chunks, and its part of every
  step's allreduce, whose count per sample does not shrink with the group), so ``m`` times that;
- decoding a sample costs ``decode_core_s`` (one preprocessor decodes on one core), spread over
  the nodes' preprocessors, or on the member's own node for a stream its member decodes;
- the coordinator (a thread of rank 0, on the first node) keeps ``coordinator_cores`` busy
  while anything trains.

A rank that waits uses little of a core, but some: the runtime's waits sleep where ranks
outnumber cores, and poll between their sleeps. A member's trainer has a stream thread that
waits for the next chunk while the trainer steps through the last (runs measured it waiting
0.85-0.95 of the time, whether its member was slow or fast): each trainer of a member keeps
``trainer_wait_cores`` busy for as long as it is in its stream. A preprocessor whose streams
have no room keeps ``preprocessor_wait_cores`` busy (its loop's rounds), for the part of the
node's preprocessors (`fleet.schedule.scenario.Scenario.preprocessors_per_node`) that decoding
leaves unused. On a node of many ranks that adds up. Where a node's work wants more than its
cores, it does not get all of them: hand-offs leave moments when every rank waits, and a
process does what its costs per
sample leave out (its loops, its messages). ``share`` is the part of the cores the work gets
then, as measured by an earlier run or a pilot on an oversubscribed node (1 where none was).

A core also does less per second the more threads take turns on it: each switch leaves the
next thread cold caches. So a model's CPU time per sample grows with the node's load per core
above one (`contention`: the part it grows by per unit of load per core), and rates measured
on an oversubscribed node (a profile's waves of every trainer at once, a run) are slower than
the same model's steps on a node with cores to spare: runs on a 2-core VM measured a model
alone 1.25-1.35 times as fast in CPU time as beside three others. ``rates_load`` is the load
per core the rates were measured at; where a node's load is lower, its work moves faster by
the ratio (never slower than measured: above ``rates_load`` nothing was measured, and sharing
the cores already slows it).

The quantities are measured (the profile's rates and decoding, the node's cores) or
learned from an earlier run's measurements; they enter here as data.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class SharedCores:
    """The cores of every node of a CPU run and what each sample costs on them.

    Attributes:
        cores: cores of one node that the job's ranks run on.
        trainer_cores: cores one busy trainer's steps use (its threads, at most the node's
            cores; 0 on the emulated device, whose steps sleep).
        decode_core_s: core-seconds to decode and augment one training sample.
        trainer_overhead_s: core-seconds a member's trainers spend per sample outside their
            steps (receiving the stream, assembling batches).
        group_overhead_s: core-seconds one trainer of a member of several trainers spends per
            sample of the stream outside its steps (its share, its allreduce and the waits in
            it; the member's are `trainers` times that); None: `trainer_overhead_s`.
        coordinator_cores: cores the coordinator keeps busy on the first node.
        share: the part of `cores` a node's work gets where it wants more than the node has
            (measured; see the module).
        nodes_per_host: nodes that share one machine's `cores` (virtual nodes: 1 for real
            nodes); their work is slowed together, by their machine's load.
        trainer_wait_cores: cores one trainer's stream thread keeps busy polling for data while
            its member is in its stream.
        preprocessor_wait_cores: cores one preprocessor keeps busy while its streams have no room.
        contention: the part a core's work per sample grows by per unit of the load per core
            above one (measured by the profile's probe: `fleet.profiling.contention`; 0: none).
        rates_load: the load per core the rates were measured at (its cores wanted over its
            cores: a profile's waves, or a run's threads ready to run).
    """

    cores: float
    trainer_cores: float = 1.0
    decode_core_s: float = 0.0
    trainer_overhead_s: float = 0.0
    group_overhead_s: float | None = None
    coordinator_cores: float = 0.0
    share: float = 1.0
    nodes_per_host: int = 1
    trainer_wait_cores: float = 0.0
    preprocessor_wait_cores: float = 0.0
    contention: float = 0.0
    rates_load: float = 1.0

    def __post_init__(self) -> None:
        if not self.cores > 0 or not self.trainer_cores >= 0:
            raise ValueError("cores must be positive and trainer_cores not negative")
        if not 0 < self.share <= 1:
            raise ValueError("share must be in (0, 1]")
        if self.nodes_per_host < 1:
            raise ValueError("nodes_per_host must be at least 1")
        if min(self.decode_core_s, self.trainer_overhead_s, self.coordinator_cores, self.group_overhead_s or 0.0,
               self.trainer_wait_cores, self.preprocessor_wait_cores, self.contention, self.rates_load) < 0:
            raise ValueError("decode_core_s, trainer_overhead_s, group_overhead_s, coordinator_cores, the wait cores, "
                             "contention and rates_load must not be negative")

    def member_rate(self, rate: float, trainers: int) -> float:
        """Samples/s a member of `rate` (alone on its `trainers`) reaches with its overhead
        (steps that use no core overlap it)."""
        if not self.trainer_cores:
            return rate
        return 1.0 / (1.0 / rate + self.overhead_s(trainers) / (trainers * self.trainer_cores))

    def member_core_s(self, rate: float, trainers: int) -> float:
        """Core-seconds per sample of a member training on `trainers` at `rate` alone."""
        return trainers * self.trainer_cores / rate + self.overhead_s(trainers)

    def overhead_s(self, trainers: int) -> float:
        """Core-seconds per sample a member of `trainers` spends outside its steps (every
        trainer of a group its own)."""
        if trainers <= 1:
            return self.trainer_overhead_s
        return trainers * (self.group_overhead_s if self.group_overhead_s is not None else self.trainer_overhead_s)

    def slowdown(self, load: float) -> float:
        """The factor (at most 1) a node's work moves at when it would use `load` cores (of
        which it gets `share` when it wants more than the node has)."""
        usable = self.cores * self.share
        return 1.0 if load <= usable else usable / load

    def uncontended(self, load: float) -> float:
        """The factor (at least 1) a node's work moves faster at `load` cores wanted than at
        the `rates_load` its rates were measured at, its cores switching between fewer threads
        (see the module)."""
        def growth(per_core: float) -> float:
            return 1.0 + self.contention * max(0.0, min(per_core, self.rates_load) - 1.0)
        return growth(self.rates_load) / growth(load / self.cores)

    def node_slowdowns(self, loads: dict[int, float]) -> dict[int, float]:
        """Per node, the factor its work moves at, its `loads` (cores wanted, by node index)
        summed over the nodes of each machine (`nodes_per_host` consecutive nodes): slowed
        where the machine's cores are short, sped where they switch between fewer threads
        than when the rates were measured."""
        hosts: dict[int, float] = {}
        for node, load in loads.items():
            hosts[node // self.nodes_per_host] = hosts.get(node // self.nodes_per_host, 0.0) + load
        host_load = {node: hosts[node // self.nodes_per_host] for node in loads}
        return {node: self.slowdown(load) * self.uncontended(load) for node, load in host_load.items()}

    def oversubscribed(self, trainers: int, preprocessors: int) -> bool:
        """Whether a node of `trainers` busy trainers and `preprocessors` decoding (each node of
        a machine that many) wants more than its machine's cores (where a measured `share`
        means something)."""
        return (trainers * self.trainer_cores + preprocessors) * self.nodes_per_host > self.cores


ASSUMED_SHARE = 0.95
"""The part of an oversubscribed CPU node's cores its work gets where nothing measured it: runs
of bench/predict.py on a 2-core machine measured 0.89-0.97, its pilots 0.94-0.95."""
ASSUMED_TRAINER_OVERHEAD_S = 1.5e-5
"""Core-seconds a member's trainers spend per sample outside their steps where nothing measured
it (a pilot of bench/predict.py's sweep, 24 px images: 1.45e-5; its runs 1.4-2.2e-5)."""


ASSUMED_TRAINER_WAIT_CORES = 0.025
"""Cores a member's trainer keeps busy polling for data where nothing measured it: its stream
thread polls for 50 us between sleeps of up to 2 ms (`fleet.runtime.waiting.SHARING`), and
wakes; bench/predict.py's runs on a 2-core VM: 0.028-0.033 of a core while waiting, waiting
0.85-0.95 of their stay."""
ASSUMED_PREPROCESSOR_WAIT_CORES = 0.02
"""The same of a preprocessor whose streams have no room (its loop's rounds between sleeps)."""


def assumed_costs(cores: SharedCores) -> SharedCores:
    """`cores` of a CPU node with what only a run measures (a pilot, an earlier run) assumed:
    `ASSUMED_SHARE`, `ASSUMED_TRAINER_OVERHEAD_S` and the wait cores; a measurement replaces
    them (`fleet.schedule.calibration.Calibration.cores`)."""
    return replace(cores, share=ASSUMED_SHARE, trainer_overhead_s=ASSUMED_TRAINER_OVERHEAD_S,
                   trainer_wait_cores=ASSUMED_TRAINER_WAIT_CORES,
                   preprocessor_wait_cores=ASSUMED_PREPROCESSOR_WAIT_CORES)
