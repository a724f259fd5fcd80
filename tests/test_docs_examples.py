"""The examples of docs/architecture.md ("Adding a policy / an engine / a collective / a
dataset reader"), imported and run: each is registered as the doc says and used through the
same registry, spec and driver as the built-in ones."""

import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, mpi_env, mpi_launcher
from docs.examples.collective_gather import GatherCollective
from docs.examples.engine_numpy import FRAMEWORK, NumpyEngine
from docs.examples.policy_longest_first import LongestFirst
from docs.examples.reader_npz import ENTRY, NpzReader
from fleet.engines import EngineOptions
from fleet.engines.factory import create_engine
from fleet.engines.registry import FRAMEWORKS
from fleet.errors import UserError
from fleet.runtime.train.collectives import COLLECTIVES
from fleet.runtime.train.collectives.factory import resolve_backend
from fleet.schedule import POLICIES, create_policy, paper100, simulate
from fleet.schedule.options import OptionError
from fleet.spec import parse_spec
from preprocess.readers import READERS
from preprocess.transforms import Pipeline

SPEC = {"name": "x", "data": {"source": "digits", "image_size": 8, "channels": 1}, "models": [{"family": "mlp"}]}


@pytest.fixture
def longest_first(monkeypatch):
    monkeypatch.setitem(POLICIES, LongestFirst.name, LongestFirst)


def test_the_policy_example_plans_through_the_registry_the_spec_and_the_simulator(longest_first):
    spec = parse_spec({**SPEC, "scheduler": {"policy": "longest-first", "gpus_per_model": 2}})
    policy = spec.scheduler.create_policy(seed=0)
    assert isinstance(policy, LongestFirst) and policy.gpus == 2
    with pytest.raises(OptionError, match="alpha"):
        create_policy("longest-first", alpha=0.8)
    workload = paper100(seed=1, models=12)
    result = simulate(create_policy("longest-first"), workload.scenario(8))
    assert not result.interrupted and result.epochs_trained == pytest.approx(workload.true_epochs)
    starts = sorted(result.timeline.members, key=lambda m: m.launched)[:8]
    longest = sorted(workload.rates.ids, key=lambda m: -workload.true_epochs[workload.rates.index(m)]
                     / workload.rates.rate(m, 1))[:8]
    assert {m.model for m in starts} == set(longest)  # the first wave is the longest work


@pytest.fixture
def numpy_framework():
    FRAMEWORKS.add("numpy-example", "docs.examples.engine_numpy:FRAMEWORK")
    yield FRAMEWORK
    FRAMEWORKS.remove("numpy-example")


def test_the_engine_example_trains_through_the_registry_and_its_state_survives_a_checkpoint(numpy_framework):
    spec = parse_spec({**SPEC, "framework": "numpy-example", "models": [{"family": "mlp", "params": {"hidden": []}}]})
    model = spec.models[0]
    engine = create_engine(EngineOptions(model, (1, 8, 8), 10))
    assert isinstance(engine, NumpyEngine) and engine.num_parameters == 65 * 10
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 1, 8, 8)).astype(np.float32)
    y = (x.reshape(256, -1)[:, :10].argmax(axis=1)).astype(np.int64)  # a learnable rule
    losses = [engine.train_step(x, y) for _ in range(200)]
    assert losses[-1] < 0.5 * losses[0] and engine.evaluate(x, y)["accuracy"] > 0.8
    saved = engine.state_bytes()
    again = create_engine(EngineOptions(model, (1, 8, 8), 10))
    again.load_state_bytes(saved)
    np.testing.assert_array_equal(again.flat_parameters(), engine.flat_parameters())
    assert engine.gradient_buffer() is engine.flat_gradients()  # reduced in place by a collective
    with pytest.raises(UserError, match="hidden: \\[\\] only"):
        create_engine(EngineOptions(parse_spec({**SPEC, "framework": "numpy-example"}).models[0], (1, 8, 8), 10))


def test_the_collective_example_sums_on_one_rank_and_is_chosen_by_name():
    from mpi4py import MPI  # initialises MPI (single rank here)

    with GatherCollective(MPI.COMM_SELF, timeout_s=10.0) as collective:
        values = np.arange(4, dtype=np.float32)
        collective.allreduce_sum(values)
        np.testing.assert_array_equal(values, np.arange(4))
    COLLECTIVES.add("gather", "docs.examples.collective_gather:GatherCollective")
    try:
        assert resolve_backend("gather", "cpu") == "gather"
        with pytest.raises(UserError, match="host arrays only"):
            resolve_backend("gather", "cuda:0")
    finally:
        COLLECTIVES.remove("gather")


@pytest.mark.mpi
def test_the_collective_example_sums_under_mpiexec():
    done = subprocess.run([*mpi_launcher(), "-n", "3", sys.executable, "docs/examples/collective_gather.py"],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=mpi_env())
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(re.findall(r"rank (\d+): sum 6 ok", done.stdout)) == ["0", "1", "2"]  # lines may interleave


def test_the_reader_example_reads_through_a_registry_entry(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (20, 8, 8, 1), dtype=np.uint8)
    np.savez(tmp_path / "set.npz", images=images, labels=np.arange(20) % 4)
    data = parse_spec({**SPEC, "data": {"source": "digits"}}).data.model_copy(
        update={"path": str(tmp_path / "set.npz"), "classes": None})
    reader = ENTRY.whole(data, 0)
    assert isinstance(reader, NpzReader) and len(reader) == 20 and reader.num_classes == 4
    batch = reader.read([3, 1])
    np.testing.assert_array_equal(batch.items, images[[3, 1]])
    assert list(batch.labels) == [3, 1]
    assert Pipeline.__name__  # the reader's batches feed the same pipeline as the built-in readers
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(UserError, match="bad.npz: not an .npz"):
        NpzReader(tmp_path / "bad.npz")
    assert all(READERS.load(name).whole for name in READERS.names)  # the built-in entries have the same shape
