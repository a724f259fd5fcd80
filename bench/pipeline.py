"""Throughput of fleet's data path beside a raw MPI broadcast of the same bytes, in one run.

Path measured: the preprocessor's chunk -> its paired master (Qp) -> the masters' broadcast ->
the scatter to the workers of a group -> each trainer's Qt -> batches (Qd) -> a trainer that
only takes the batch (no step, no per-step allreduce; epoch ends, evaluation, checkpoints and
reports are the real ones). A batch that spans shares holds the shares' rows in pieces; an
engine joins them where it uses them (on CUDA into the pinned buffer of its host-to-device
copy), which is past the end of this path. Two models share one stream: A on all trainers but one (master
+ workers), B on the last. Decoding is not part of the path either: the path starts where a
decoded chunk goes into Qp, so the preprocessor's decode is replaced by a copy of the rows of
a chunk decoded in advance into the buffer, as a decode's output would be written (2 MB of
memcpy a chunk on the preprocessor's core); with `--no-fill` it writes only the header and
labels, and the rows hold whatever they held. Both replacements are patches this bench makes; fleet
itself never does this.

Raw baseline: rank 0 broadcasts the same number of chunks of the same size to all trainer
ranks with blocking `MPI_Bcast`. Beside it, for the diagnosis, fleet's messages alone
(`message_pattern`: the same synchronous sends, hops and polling, with no queues, threads or
batches), which splits the gap into what the point-to-point pattern costs and what the
layers around it cost.

Measurement: `--rounds` alternating pairs (a `fleet train` run, then the raw broadcasts), so
drift on a shared machine hits both alike. The path's rate is the median over every run's
epochs 2..N (epoch 1 fills the queues); each raw measurement moves one epoch's chunks, the
same bytes as one of those epochs. Oversubscribed (4 ranks on 2 cores) the blocking
broadcast alone varies 1.5-2x between repetitions with how the OS schedules its spinning
ranks, hence the medians; run nothing else meanwhile.

On one node the masters read each chunk in the preprocessor's shared-memory slot
(`fleet.runtime.data.shm`); `--bytes-too` also runs the path with `runtime.shared_memory: false`
(chunks as MPI messages) in each round, for the two side by side.

Usage: .venv/bin/python bench/pipeline.py [--trainers 3] [--image-size 32] [--chunk 168]
       [--epochs 4] [--samples 60000] [--rounds 3] [--no-fill] [--bytes-too] [--runtime KEY=VALUE ...]
Prints the medians and their ratio (target: the path reaches >= 70% of the faster raw
broadcast).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from _harness import at_least, read_results, run_to_end, runtime_option
from preprocess.make import make_synthetic

RAW_REPEATS = 3  # raw measurements per round


def raw_bcast(chunk_bytes: int, chunks: int) -> None:
    """Under mpiexec: rank 0 broadcasts `chunks` buffers of `chunk_bytes` to every rank, once
    with blocking `MPI_Bcast` (MPI spins while it waits) and once with `MPI_Ibcast` waited
    on the way fleet waits on this node (sleep-polling where ranks outnumber cores)."""
    import numpy as np
    from mpi4py import MPI

    from fleet.runtime.waiting import busy_polling_fits, use_busy_polling, wait_request

    world = MPI.COMM_WORLD
    use_busy_polling(busy_polling_fits(2 * world.size))  # as fleet's runtime.poll: auto would
    buffer = np.ones(chunk_bytes, np.uint8)
    seconds: dict[str, list[float]] = {"blocking": [], "polled": []}
    for _ in range(RAW_REPEATS):
        for name in seconds:
            world.Barrier()
            started = time.perf_counter()
            for _ in range(chunks):
                if name == "blocking":
                    world.Bcast(buffer, root=0)
                else:
                    wait_request(world.Ibcast(buffer, root=0), "a broadcast", 600)
            world.Barrier()
            seconds[name].append(time.perf_counter() - started)
    seconds["pattern"] = [message_pattern(world, chunk_bytes, chunks, wait_request) for _ in range(RAW_REPEATS)]
    if world.rank == 0:
        from fleet.runtime.launch.process import mpi_library

        print(json.dumps({**seconds, "library": mpi_library()}))


def message_pattern(world, chunk_bytes: int, chunks: int, wait_request) -> float:
    """fleet's messages for a chunk and nothing else, waited on fleet's way: rank 0 sends it to
    B's master (the last rank, the root as in the path), which sends it on to A's master (rank
    1), which sends each of A's workers its share of the rows. No queues, threads or batches:
    the transport's own speed for the path's pattern. Seconds for `chunks` chunks."""
    import numpy as np

    window, last, workers = 4, world.size - 1, list(range(2, world.size - 1))
    share = chunk_bytes // (len(workers) + 1)
    size = share if 2 <= world.rank < last else chunk_bytes
    buffers = [np.ones(size, np.uint8) for _ in range(window)]
    sources = {last: 0, 1: last}
    source = sources.get(world.rank, 1)
    sends: list = []  # (chunk, requests) of this rank's last chunks
    world.Barrier()
    started = time.perf_counter()
    if world.rank == 0:
        for k in range(chunks):
            if len(sends) == window:
                wait_request(sends.pop(0)[1][0], "a chunk send", 600)
            sends.append((k, [world.Issend(buffers[k % window], dest=last, tag=k % window)]))
    else:
        receives = {k: world.Irecv(buffers[k % window], source=source, tag=k % window) for k in range(min(window, chunks))}
        for k in range(chunks):
            wait_request(receives.pop(k), "a chunk", 600)
            buffer, out = buffers[k % window], []
            if world.rank == last:
                out = [world.Issend(buffer, dest=1, tag=k % window)]
            elif world.rank == 1:
                out = [world.Issend(buffer[(j + 1) * share:(j + 2) * share], dest=w, tag=k % window)
                       for j, w in enumerate(workers)]
            sends.append((k, out))
            if len(sends) > 1 or k + 1 == chunks:
                done, requests = sends.pop(0)
                for request in requests:
                    wait_request(request, "a share send", 600)
                if done + window < chunks:
                    receives[done + window] = world.Irecv(buffers[done % window], source=source, tag=done % window)
    for _, requests in sends:
        for request in requests:
            wait_request(request, "a send", 600)
    world.Barrier()
    return time.perf_counter() - started


def patched_pipeline(spec: str, run_dir: str, fill: bool) -> None:
    """Under mpiexec: `fleet train` with the preprocessor's decode replaced by writing the
    chunk's header and labels (and, with `fill`, copying pre-decoded rows)."""
    import numpy as np

    from fleet.runtime.data import preprocessor
    from fleet.runtime.train import trainer
    from fleet.runtime.data.chunks import write_header
    from fleet.rank_entry import train_entry
    from fleet.runtime.rank import TrainOptions

    ready: dict = {}

    def decoded_in_advance(self, chunk: int, buffer) -> int:
        count = len(self.order.indices(chunk))
        if "images" not in ready:
            raw = self.ctx.reader.read(np.sort(self.order.indices(0)))
            ready["images"] = self.ctx.pipeline(raw, self.order.rng(0), train=True)
            ready["labels"] = raw.labels
        if fill:
            self.chunks.images(buffer)[:count] = ready["images"][:count]
        self.chunks.labels(buffer)[:count] = ready["labels"][:count]
        newest_first, newest = self.layouts[-1]
        notice = (newest.version, newest_first) if newest_first > chunk else (0, 0)
        write_header(self.chunks.header(buffer), chunk, self.order.epoch_of(chunk), count, regroup=notice)
        return count

    def consume_only(self, batcher, stream) -> bool:
        while True:
            batch = self._next_batch(batcher, stream)
            if batch.epoch_end and self._end_epoch():
                return True

    preprocessor.StreamProducer._decode = decoded_in_advance
    trainer.GroupTraining._train = consume_only
    sys.exit(train_entry(TrainOptions(spec, run_dir, quiet=True)))


def mpiexec(ranks: int) -> list[str]:
    from fleet.runtime.launch.mpiexec import find_mpiexec, launcher_for

    return [*launcher_for(find_mpiexec()), "-n", str(ranks), sys.executable]



def setup(root: Path, args) -> tuple[Path, Path, Path, int]:
    """Data set, spec and profile.json for a stream of A (trainers - 1 GPUs) and B (1 GPU)."""

    data = root / "data.h5"
    make_synthetic(data, "hdf5", classes=10, samples=args.samples, image_size=args.image_size, channels=3,
                   progress=False)
    train_size = int(args.samples * 0.95)
    spec = {
        "name": "pipeline", "seed": 0,
        "data": {"source": "hdf5", "path": str(data), "image_size": args.image_size, "channels": 3,
                 "val_fraction": 0.05},
        "models": [{"family": "mlp", "name": "A"}, {"family": "mlp", "name": "B"}],
        "train": {"batch_size": args.chunk, "max_epochs": args.epochs},
        "scheduler": {"policy": "fleet-g"},
        "cluster": {"nodes": 1, "gpus_per_node": args.trainers, "preprocessors_per_node": 1, "device": "emulated"},
        "runtime": {"chunk_samples": args.chunk, "collective": "mpi", "timeout_s": 120,
                    **dict(runtime_option(text) for text in args.runtime)},
    }
    a_gpus = args.trainers - 1
    fast = 1e9
    profile = {"schema": 1, "gpus_per_node": args.trainers, "samples_per_epoch": train_size, "models": [
        {"id": "A", "rates": {str(m): fast * m / a_gpus for m in range(1, args.trainers + 1)}, "epochs": args.epochs},
        {"id": "B", "rates": {str(m): fast for m in range(1, args.trainers + 1)}, "epochs": args.epochs},
    ]}
    spec_path, profile_path, bytes_path = root / "spec.yaml", root / "profile.json", root / "spec-bytes.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    spec["runtime"]["shared_memory"] = False
    bytes_path.write_text(yaml.safe_dump(spec))
    profile_path.write_text(json.dumps(profile))
    return spec_path, bytes_path, profile_path, train_size


def path_run(spec: Path, profile: Path, run_dir: Path, fill: bool, ranks: int, env: dict, train_size: int):
    """One `fleet train` of the patched path: each epoch's rate, the stream's members, and the
    chunks its masters read in shared memory."""
    run_dir.mkdir()
    shutil.copy(profile, run_dir / "profile.json")
    flags = [] if fill else ["--no-fill"]
    run_to_end([*mpiexec(ranks), __file__, "--patched", str(spec), str(run_dir), *flags], "pipeline run", 900, env)
    rates, members = epoch_rates(run_dir, train_size)
    return rates, members, read_results(run_dir).get("chunks_in_shared_memory", 0)


def epoch_rates(run_dir: Path, train_size: int) -> tuple[list[float], list[list]]:
    """Samples per second through the path in each epoch after the first: the slower of the
    two members' rates in that epoch (epoch 1, which fills the queues, is left out)."""
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    epochs = [e for e in events if e["event"] == "epoch"]
    last = max(e["epoch"] for e in epochs)
    rates = [min(train_size / e["epoch_s"] for e in epochs if e["epoch"] == k) for k in range(2, last + 1)]
    plan = json.loads((run_dir / "plan.json").read_text())["rounds"][0]["members"]
    return rates, [[m["model"], m["gpus"]] for m in plan]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainers", type=at_least(2, " (one model on all trainers but the last, one on the last)"), default=3)
    parser.add_argument("--image-size", type=at_least(1), default=32)
    parser.add_argument("--chunk", type=at_least(1), default=168, help="samples per chunk (168: what auto picks here)")
    parser.add_argument("--epochs", type=at_least(2, " (epoch 1 fills the queues and is not timed)"), default=4)
    parser.add_argument("--samples", type=at_least(1), default=60000)
    parser.add_argument("--rounds", type=at_least(1), default=3, help="alternating (path, raw) measurement pairs")
    parser.add_argument("--runtime", action="append", default=[], metavar="KEY=VALUE",
                        help="a runtime option of the spec, e.g. poll=busy (repeatable)")
    parser.add_argument("--no-fill", dest="fill", action="store_false",
                        help="write only each chunk's header and labels on the preprocessor, not its rows")
    parser.add_argument("--bytes-too", action="store_true",
                        help="each round also runs the path with runtime.shared_memory false (chunks as MPI messages)")
    parser.add_argument("--raw", nargs=2, type=int, metavar=("CHUNK_BYTES", "CHUNKS"), help=argparse.SUPPRESS)
    parser.add_argument("--patched", nargs=2, metavar=("SPEC", "RUN_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.raw:
        return raw_bcast(*args.raw)
    if args.patched:
        return patched_pipeline(*args.patched, args.fill)

    from fleet.runtime.data.chunks import ChunkLayout
    from fleet.runtime.launch.mpiexec import find_mpiexec

    ranks = args.trainers + 1
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    path_rates: list[float] = []
    raw_samples: dict[str, list[float]] = {"blocking": [], "polled": []}
    round_ratios: list[float] = []  # each round's path against that round's raw broadcasts
    pattern_samples: list[float] = []  # fleet's messages alone (`message_pattern`)
    bytes_rates: list[float] = []  # the path with chunks as MPI messages (--bytes-too)
    with tempfile.TemporaryDirectory() as tmp:
        spec, spec_bytes, profile, train_size = setup(Path(tmp), args)
        chunk_bytes = ChunkLayout(args.chunk, (3, args.image_size, args.image_size)).nbytes
        chunks = -(-train_size // args.chunk)  # one epoch's chunks
        for round_ in range(1, args.rounds + 1):
            # a fresh run each round, with the same profile
            rates, members, in_place = path_run(spec, profile, Path(tmp) / f"run{round_}", args.fill, ranks, env,
                                               train_size)
            path_rates += rates
            if args.bytes_too:
                bytes_rates += path_run(spec_bytes, profile, Path(tmp) / f"bytes{round_}", args.fill, ranks,
                                        env, train_size)[0]
            raw = run_to_end([*mpiexec(ranks), __file__, "--raw", str(chunk_bytes), str(chunks)], "raw broadcast",
                             900, env)
            measured = json.loads(raw.stdout.strip().splitlines()[-1])
            library = measured.pop("library")
            this_round = {name: [chunks * args.chunk / s for s in times] for name, times in measured.items()}
            pattern_samples += this_round.pop("pattern")
            for name, samples in this_round.items():
                raw_samples[name] += samples
            round_ratios.append(statistics.median(rates) / max(map(statistics.median, this_round.values())))
            print(f"round {round_}: path {', '.join(f'{r:,.0f}' for r in rates)}; raw blocking "
                  f"{', '.join(f'{r:,.0f}' for r in this_round['blocking'])} samples/s; "
                  f"ratio {round_ratios[-1]:.2f}; {in_place:,} chunks read in shared memory", flush=True)
    path_rate = statistics.median(path_rates)
    raw_rates = {name: statistics.median(rates) for name, rates in raw_samples.items()}
    raw_rate = max(raw_rates.values())
    mb = chunk_bytes / 1e6
    print(f"ranks {ranks} (1 preprocessor + {args.trainers} trainers), stream members {members}; "
          f"{library}, launched by {find_mpiexec()}")
    print(f"chunk {args.chunk} samples of 3x{args.image_size}x{args.image_size} float32 = {mb:.2f} MB")
    print("preprocessor: pre-decoded rows copied into every chunk" if args.fill
          else "preprocessor: header and labels written, rows not (--no-fill)")
    print(f"{'path':<44}{'samples/s':>12}{'MB/s':>10}")
    print(f"{'fleet Qp->masters->scatter->Qd':<44}{path_rate:>12,.0f}{path_rate * mb / args.chunk:>10,.0f}")
    if bytes_rates:
        rate = statistics.median(bytes_rates)
        print(f"{'  the same, chunks as MPI messages':<44}{rate:>12,.0f}{rate * mb / args.chunk:>10,.0f}"
              f"   (shared memory / messages: {path_rate / rate:.2f})")
    for name, label in (("blocking", "raw MPI_Bcast (blocking)"), ("polled", "raw MPI_Ibcast (fleet's polling)")):
        rate = raw_rates[name]
        print(f"{label + ' of the same chunks':<44}{rate:>12,.0f}{rate * mb / args.chunk:>10,.0f}")
    pattern_rate = statistics.median(pattern_samples)
    print(f"{'fleet messages alone (no queues or threads)':<44}{pattern_rate:>12,.0f}{pattern_rate * mb / args.chunk:>10,.0f}")
    print(f"medians of {len(path_rates)} path epochs and {len(raw_samples['blocking'])} raw measurements of each kind")
    print(f"ratio fleet / the faster raw broadcast: {path_rate / raw_rate:.2f} (target >= 0.70); "
          f"per round {', '.join(f'{r:.2f}' for r in round_ratios)} (the raw broadcast's speed changes by launch)")
    print(f"fleet's messages alone / the faster raw broadcast: {pattern_rate / raw_rate:.2f}; "
          f"the path / its messages alone: {path_rate / pattern_rate:.2f}")


if __name__ == "__main__":
    main()
