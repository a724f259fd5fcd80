"""Collective backends: sums, broadcasts, data-parallel equivalence, waiting, teardown.

Two tiers (STYLE.md 8): the bodies in tests/mpi/collective_cases.py run here on
`MPI.COMM_SELF`, and under a real ``mpiexec -n 2`` / ``-n 4`` through
tests/mpi/collective_main.py, where every rank prints one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from mpi4py import MPI

from fleet.errors import UserError
from fleet.runtime.train.collectives import AUTO_ORDER, COLLECTIVES, kinds
from fleet.runtime.train.collectives._base import CollectiveError, CollectiveState
from fleet.runtime.train.collectives.factory import available_backends, create_collective, resolve_backend
from fleet.runtime.train.collectives.horovod import HorovodCollective
from fleet.runtime.train.collectives.mpi import MPICollective
from fleet.runtime.train.collectives.solo import SoloCollective

REPO = Path(__file__).resolve().parent.parent
MPI_DIR = REPO / "tests" / "mpi"
sys.path.append(str(MPI_DIR))  # collective_cases, also the home of the user model `plain_cnn`

import collective_cases as cases  # noqa: E402
from conftest import mpi_env, mpi_launcher, quiet_mpi_launcher  # noqa: E402

TOL = {"float32": 1e-5, "float64": 1e-12}
EQUIVALENCE_RTOL = 1e-5


# -- checks shared by both tiers ----------------------------------------------------------------


def check_sums(result: dict, size: int) -> None:
    for name in (*cases.BACKEND_NAMES, "torch-gloo/tcp"):
        for dtype in ("float32", "float64"):
            key = f"{name}/{dtype}"
            assert result[f"{key}/sum_err"] < TOL[dtype] * size, key
            assert result[f"{key}/exact"], key
            assert result[f"{key}/bcast"], key
            assert result[f"{key}/large_exact"] and result[f"{key}/large_bcast"], key
    assert result["mpi/name"] == "mpi"
    assert result["torch-gloo/name"] == "torch-gloo"
    assert result["agree/float32"] < TOL["float32"] * size
    assert result["agree/float64"] < TOL["float64"] * size


def equivalence_keys(result: dict) -> list[str]:
    return sorted(key[: -len("/loss_rel")] for key in result if key.endswith("/loss_rel"))


def check_equivalence(result: dict) -> None:
    keys = equivalence_keys(result)
    assert len(keys) == len(cases.BACKEND_NAMES) * len(cases.MODELS) * 2
    for key in keys:
        assert result[f"{key}/loss_rel"] < EQUIVALENCE_RTOL, key
        assert result[f"{key}/param_rel"] < EQUIVALENCE_RTOL, key


def check_churn(result: dict) -> None:
    for name in cases.BACKEND_NAMES:
        churn = result[f"{name}/churn"]
        threads_before, fds_before = churn["before"]
        threads_after, fds_after = churn["after"]
        assert threads_after <= threads_before, (name, churn)
        assert fds_after <= fds_before, (name, churn)


# -- tier 1: one rank, plain pytest -------------------------------------------------------------


@pytest.fixture(scope="module")
def single_rank():
    return cases.all_checks(MPI.COMM_SELF)


def test_single_rank_sums_and_broadcasts(single_rank):
    check_sums(single_rank, 1)


def test_single_rank_group_equals_one_process(single_rank):
    check_equivalence(single_rank)


def test_single_rank_groups_leave_no_threads_or_fds(single_rank):
    check_churn(single_rank)


def test_resolve_backend():
    assert resolve_backend("mpi", "cpu") == "mpi"
    assert resolve_backend("auto", "cpu") == ("horovod" if cases.HOROVOD else "torch-gloo")
    assert resolve_backend("torch", "cpu") == "torch-gloo"
    assert set(available_backends()) <= {"mpi", "torch-gloo", "torch-nccl", "horovod", "horovod-nccl"}
    assert {"mpi", "torch-gloo"} <= set(available_backends())
    with pytest.raises(UserError, match="collective 'nccl': expected one of auto, mpi, torch, horovod"):
        resolve_backend("nccl", "cpu")


def test_the_registry_gives_the_kinds_and_the_spec_its_valid_names():
    from fleet.spec import parse_spec

    assert kinds() == ("auto", *COLLECTIVES.names) == ("auto", "mpi", "torch", "horovod")
    assert set(AUTO_ORDER) <= set(COLLECTIVES.names)
    base = {"name": "t", "data": {"source": "digits"}, "models": [{"family": "mlp"}]}
    for kind in kinds():
        assert parse_spec({**base, "runtime": {"collective": kind}}).runtime.collective == kind
    with pytest.raises(UserError, match=r"^runtime.collective: unknown collective 'gloo' \(valid: auto, mpi, torch, horovod\)$"):
        parse_spec({**base, "runtime": {"collective": "gloo"}})


def test_auto_takes_the_first_usable_backend_and_a_broken_one_is_skipped(monkeypatch):
    COLLECTIVES.add("broken", "fleet_no_such_collective_module:Backend")
    try:
        monkeypatch.setattr("fleet.runtime.train.collectives.AUTO_ORDER", ("broken", "mpi", "torch"))
        assert resolve_backend("auto", "cpu") == "mpi"  # not importable here: skipped
        with pytest.raises(UserError, match=r"^collective 'broken': cannot import it here; use 'mpi'$"):
            resolve_backend("broken", "cpu")
    finally:
        COLLECTIVES.remove("broken")


def test_the_package_imports_no_torch():
    script = "import sys, fleet.runtime.train.collectives; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_torch_on_cuda_without_nccl_is_a_user_error():
    if "torch-nccl" in available_backends():  # auto takes Horovod first where it is built with NCCL
        assert resolve_backend("auto", "cuda:0") == ("horovod-nccl" if "horovod-nccl" in available_backends() else "torch-nccl")
        return
    assert resolve_backend("auto", "cuda:0") == "mpi"
    with pytest.raises(UserError, match="no nccl backend"):
        resolve_backend("torch", "cuda:0")


@pytest.mark.parametrize("kind", ["auto", "mpi", "torch"])
def test_a_group_of_one_gets_the_solo_collective(kind):
    coll = create_collective(kind, MPI.COMM_SELF, "cpu", 5.0, label="group 'alone'")
    assert isinstance(coll, SoloCollective) and coll.name == "solo"
    assert (coll.size, coll.rank) == (1, 0)
    buf = np.arange(4, dtype=np.float32)
    coll.allreduce_sum(buf)
    coll.broadcast(buf)
    assert np.array_equal(buf, np.arange(4))
    coll.close()


def test_create_collective_rejects_an_unknown_kind():
    with pytest.raises(UserError, match="collective 'gloo'"):
        create_collective("gloo", MPI.COMM_SELF, "cpu", 5.0)


def test_horovod_that_cannot_be_imported_is_a_user_error_naming_the_build(monkeypatch):
    monkeypatch.setattr("fleet.runtime.train.collectives.horovod.hvd", None)
    monkeypatch.setattr("fleet.runtime.train.collectives.horovod.IMPORT_ERROR", "No module named 'horovod'")
    message = r"^collective 'horovod': Horovod with PyTorch cannot be imported here \(No module named 'horovod'\); build it into this environment with `make horovod`"
    with pytest.raises(UserError, match=message):
        resolve_backend("horovod", "cpu")
    assert resolve_backend("auto", "cpu") == "torch-gloo"  # auto goes on to the next


def test_horovod_is_built_where_it_is_required():
    """CI sets FLEET_REQUIRE_HOROVOD=1 after `make horovod`: its tests must run there, not skip."""
    if os.environ.get("FLEET_REQUIRE_HOROVOD") != "1":
        pytest.skip("FLEET_REQUIRE_HOROVOD is not set")

    assert cases.HOROVOD, HorovodCollective.unavailable("cpu")


@pytest.mark.parametrize("bad", [np.ones(3, np.float16), np.ones((2, 2)), np.ones(6)[::2], [1.0, 2.0]])
def test_host_arrays_must_be_1d_contiguous_float(bad):
    with MPICollective(MPI.COMM_SELF, 5.0) as coll:
        with pytest.raises(TypeError, match="allreduce_sum in a group of 1 rank"):
            coll.allreduce_sum(bad)


def test_a_closed_collective_refuses_calls_and_closes_once():
    coll = MPICollective(MPI.COMM_SELF, 5.0, label="group 'gone'")
    assert coll.state is CollectiveState.OPEN
    coll.close()
    coll.close()
    assert coll.state is CollectiveState.CLOSED
    closed = r"allreduce_sum in group 'gone' \(mpi, rank 0 of 1\): the collective is closed"
    with pytest.raises(CollectiveError, match=closed):
        coll.allreduce_sum(np.ones(2))


def test_broadcast_root_must_be_a_member():
    with MPICollective(MPI.COMM_SELF, 5.0) as coll:
        with pytest.raises(ValueError, match="root 1 is not a member"):
            coll.broadcast(np.ones(2), root=1)


def test_torch_collective_refuses_an_unknown_store():
    from fleet.runtime.train.collectives.torch_dist import TorchCollective

    with pytest.raises(ValueError, match="store 'nfs'"):
        TorchCollective(MPI.COMM_SELF, "cpu", 5.0, store="nfs")


def cuda_collective(kind: str):
    """`kind`'s collective on cuda:0 over COMM_SELF (skips Horovod where it lacks NCCL)."""
    from fleet.runtime.train.collectives.torch_dist import TorchCollective

    if kind == "mpi":
        return MPICollective(MPI.COMM_SELF, 60.0)
    if kind == "torch":
        return TorchCollective(MPI.COMM_SELF, "cuda:0", 60.0)
    why = HorovodCollective.unavailable("cuda:0")
    if why is not None and os.environ.get("FLEET_REQUIRE_HOROVOD") != "1":
        pytest.skip(why)
    return HorovodCollective(MPI.COMM_SELF, "cuda:0", 60.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", ["mpi", "torch", "horovod"])
def test_cuda_engine_in_a_group_of_one(kind):
    """The CUDA paths on one rank: host copies for mpi, NCCL on the device for torch and
    Horovod (built with HOROVOD_GPU_OPERATIONS=NCCL); arrays of both sizes Horovod treats apart."""
    coll = cuda_collective(kind)
    assert coll.name == {"mpi": "mpi", "torch": "torch-nccl", "horovod": "horovod-nccl"}[kind]
    with coll:
        for size in (5, 1 << 20):  # a control vector, and an array past Horovod's SMALL_BYTES
            buf = np.arange(size, dtype=np.float32)
            coll.allreduce_sum(buf)
            coll.broadcast(buf)
            assert np.array_equal(buf, np.arange(size))
        batches = cases.global_batches(3, 16)
        losses, params = cases.group_run(coll, "mlp", batches, (16,), device="cuda:0")
    ref_losses, ref_params = cases.reference_run("mlp", batches, device="cuda:0")
    assert cases.relative(losses, ref_losses) < EQUIVALENCE_RTOL
    assert cases.relative(params, ref_params) < EQUIVALENCE_RTOL


# -- tier 2: real mpiexec -----------------------------------------------------------------------


def run_ranks(size: int, suite: str, timeout: float = 150) -> tuple[list[dict], subprocess.CompletedProcess]:
    """Run collective_main.py SUITE on `size` ranks; the record of every rank, by rank."""
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = mpi_env({"PYTHONPATH": path})
    with tempfile.TemporaryDirectory(prefix="fleet-collectives-") as records:
        command = [*mpi_launcher(), "-n", str(size), sys.executable, str(MPI_DIR / "collective_main.py"), suite, records]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"{suite} on {size} ranks ran past {timeout} s:\n{exc.stdout!s:.3000}\n{exc.stderr!s:.3000}")
        results = [json.loads(path.read_text()) for path in sorted(Path(records).glob("rank-*.json"))]
    assert sorted(r["rank"] for r in results) == list(range(size)), proc.stdout[-2000:] + proc.stderr[-3000:]
    return sorted(results, key=lambda r: r["rank"]), proc


@pytest.fixture(scope="module", params=[(2, "checks"), (3, "checks"), (4, "checks"), (2, "checks-busy")],
                ids=["n2", "n3", "n4", "n2-busy"])
def world_checks(request):
    """Every backend's checks on 2-4 ranks, and on 2 ranks polling busily (large arrays then
    move in blocking calls: the MPI backend's after a polled barrier, Horovod's inside it)."""
    size, suite = request.param
    results, proc = run_ranks(size, suite)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return size, results


@pytest.mark.openmpi
@pytest.mark.mpi
def test_sums_and_broadcasts_on_every_rank(world_checks):
    size, results = world_checks
    for result in results:
        check_sums(result, size)
    for name in (*cases.BACKEND_NAMES, "torch-gloo/tcp"):
        for dtype in ("float32", "float64"):
            assert len({r[f"{name}/{dtype}/crc"] for r in results}) == 1, "members got different sums"


@pytest.mark.openmpi
@pytest.mark.mpi
def test_group_of_m_equals_one_process_on_the_global_batch(world_checks):
    """The runtime issue's test: m trainers give the losses and weights of one process."""
    size, results = world_checks
    for result in results:
        check_equivalence(result)
    for key in equivalence_keys(results[0]):
        assert len({r[f"{key}/param_crc"] for r in results}) == 1, f"{key}: replicas diverged"


@pytest.mark.openmpi
@pytest.mark.mpi
def test_thirty_groups_leave_no_threads_or_fds(world_checks):
    _, results = world_checks
    for result in results:
        check_churn(result)


@pytest.mark.openmpi
@pytest.mark.mpi
def test_waiting_for_a_late_rank_does_not_spin():
    results, _ = run_ranks(2, "nospin")
    for name in cases.BACKEND_NAMES:
        assert all(r[name]["sum_ok"] for r in results), name
        waited = results[0][name]
        assert waited["wall_s"] > 1.0, waited  # rank 0 did wait for the late rank
        assert waited["cpu_share"] < 0.3, (name, waited)


@pytest.mark.openmpi
@pytest.mark.mpi
def test_a_rank_that_never_joins_gives_a_wait_timeout_naming_the_operation():
    results, _ = run_ranks(2, "timeout")
    for name in cases.BACKEND_NAMES:
        waited = results[0][name]
        assert waited["raised"] == "WaitTimeout", waited
        assert "allreduce_sum of 8 float64 in group 'lonely'" in waited["message"], waited
        assert f"({name}, rank 0 of 2)" in waited["message"], waited
        assert results[1][name] == {"released_by": name}


@pytest.mark.openmpi
@pytest.mark.mpi
def test_a_spec_asking_for_horovod_where_it_is_not_built_stops_with_one_line(tmp_path):
    """`fleet run` before starting any rank, and `fleet train` under mpiexec (as a batch script
    runs it) on every rank alike: exit 2 and one line naming the way to build it."""
    import yaml

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "h", "data": {"source": "digits"}, "models": [{"family": "mlp"}], "runtime": {"collective": "horovod"},
        "cluster": {"nodes": 1, "gpus_per_node": 2, "preprocessors_per_node": 1, "device": "cpu"}}))
    hidden = os.pathsep.join([str(REPO / "tests" / "shims" / "no-horovod"), str(REPO), os.environ.get("PYTHONPATH", "")])
    env = mpi_env({"PYTHONPATH": hidden})
    fleet = [sys.executable, "-m", "fleet"]
    commands = {"run": [*fleet, "run", str(spec), "--run-dir", str(tmp_path / "a")],
                "train": [*quiet_mpi_launcher(), "-n", "3", *fleet, "train", str(spec), "--run-dir", str(tmp_path / "b")]}
    for name, command in commands.items():
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
        lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        assert done.returncode == 2, (name, lines)
        assert len(lines) == 1, (name, lines)
        assert f"fleet {name}: error: collective 'horovod': Horovod with PyTorch cannot be imported here" in lines[0]
        assert "make horovod" in lines[0]


@pytest.mark.skipif(not cases.HOROVOD, reason="Horovod is not built here (make horovod)")
def test_a_horovod_operation_does_not_wait_out_the_cycle(monkeypatch):
    """`make horovod` patches Horovod's background thread to wake when an operation is
    enqueued (tools/horovod-wake.h): with a cycle of 300 ms, unpatched, each call waits for the
    next cycle (about 300 ms one after another); patched, ten take a fraction of one."""
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "300")  # milliseconds, read when Horovod starts
    with HorovodCollective(MPI.COMM_SELF, "cpu", 30.0, "group 'one'") as coll:
        buf = np.ones(70_000, dtype=np.float32)  # over SMALL_BYTES: through Horovod
        coll.allreduce_sum(buf)  # the first call negotiates the name; later ones hit the cache
        start = time.monotonic()
        for _ in range(10):
            coll.allreduce_sum(buf)
        took = time.monotonic() - start
    assert np.array_equal(buf, np.ones(70_000))
    assert took < 0.3, f"10 allreduces took {took:.3f} s: Horovod waited out its cycle (rebuild with make horovod)"


@pytest.mark.skipif(not cases.HOROVOD, reason="Horovod is not built here (make horovod)")
def test_horovod_runs_only_while_its_group_is_open():
    """Horovod is started for a group and shut down with it, so the next group of this process
    can start its own; a second group while one is open is refused, naming why."""
    import horovod.torch as hvd


    for _ in range(3):
        with HorovodCollective(MPI.COMM_SELF, "cpu", 30.0, "group 'one'") as coll:
            assert hvd.is_initialized() and hvd.size() == 1
            buf = np.arange(70_000, dtype=np.float32)  # over SMALL_BYTES: through Horovod
            coll.allreduce_sum(buf)
            assert np.array_equal(buf, np.arange(70_000))
            with pytest.raises(CollectiveError, match="Horovod already runs another group in this process"):
                HorovodCollective(MPI.COMM_SELF, "cpu", 30.0, "group 'two'")
        assert not hvd.is_initialized()
