"""Topology under MPI, in two tiers (STYLE item 8).

Tier 1 runs the probe's body in this process on a single-rank communicator. Tier 2 (marked
``mpi``) runs ``tests/mpi/topology_probe.py`` under a real ``mpiexec -n 4/6`` as a
subprocess: every rank prints one JSON line and all of them must agree; a spec that does not
fit the ranks must end every rank with status 2 and exactly one line on stderr.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import mpi_env, quiet_mpi_launcher
from fleet.runtime.launch.jobenv import JobEnv
from fleet.runtime.launch.topology import (
    HOSTNAME_BYTES,
    TopologyError,
    build_topology,
    gather_node_names,
    node_of_rank_by_hostname,
)
from fleet.spec import ClusterSpec

REPO = Path(__file__).resolve().parent.parent
PROBE = REPO / "tests" / "mpi" / "topology_probe.py"
RUN_TIMEOUT_S = 60


def load_probe():
    spec = importlib.util.spec_from_file_location("topology_probe", PROBE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- tier 1: one rank, in this process --------------------------------------------------


@pytest.fixture(scope="module")
def comm_self():
    from mpi4py import MPI

    return MPI.COMM_SELF


def test_single_rank_gathers_its_own_name(comm_self):
    assert gather_node_names(comm_self, "node-a", timeout_s=10) == ["node-a"]
    assert node_of_rank_by_hostname(comm_self, JobEnv(node_name="n7"), timeout_s=10) == [0]


def test_single_rank_long_name_is_digested(comm_self):
    (name,) = gather_node_names(comm_self, "x" * HOSTNAME_BYTES, timeout_s=10)
    assert len(name) == 64 and name != "x" * 64


def test_single_rank_probe_fails_like_every_rank_would(comm_self):
    probe = load_probe()
    expected = r"^cluster: the job has 1 rank on 1 node; .* at least one preprocessor"
    with pytest.raises(TopologyError, match=expected):
        probe.probe(comm_self, ClusterSpec(nodes=1, gpus_per_node=1, preprocessors_per_node="auto"))


@pytest.mark.parametrize("ranks_per_node, virtual", [(1, False), (None, True)])
def test_single_rank_virtual_nodes(comm_self, ranks_per_node, virtual):
    spec = ClusterSpec(nodes=1, gpus_per_node=1, virtual_nodes=virtual)
    with pytest.raises(TopologyError, match="the job has 1 rank on 1 node"):
        build_topology(comm_self, spec, JobEnv(), ranks_per_node)


# --- tier 2: a real mpiexec -------------------------------------------------------------


def run_probe(n: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*quiet_mpi_launcher(), "-n", str(n), sys.executable, str(PROBE), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=mpi_env(),
    )


def records(stdout: str, n: int) -> list[dict]:
    """One JSON record per rank, by rank."""
    lines = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    assert sorted(r["rank"] for r in lines) == list(range(n)), stdout
    return sorted(lines, key=lambda r: r["rank"])


def assert_agree(found: list[dict]) -> dict:
    """Every rank computed the same topology; returns rank 0's record."""
    keys = ("nodes", "node_of", "roles", "gpus", "node_names", "describe")
    for record in found[1:]:
        assert {k: record[k] for k in keys} == {k: found[0][k] for k in keys}
    for record in found:
        assert record["env"]["launcher"] != "unknown"
        assert (record["env"]["rank"], record["env"]["size"]) == (record["rank"], record["size"])
    return found[0]


def assert_quiet(proc: subprocess.CompletedProcess) -> None:
    for text in (proc.stdout, proc.stderr):
        assert "BAD TERMINATION" not in text and "Abort(" not in text and "Traceback" not in text


@pytest.mark.openmpi
@pytest.mark.mpi
def test_hostname_discovery_finds_this_machine():
    proc = run_probe(4, "--gpus-per-node", "2")
    assert proc.returncode == 0, proc.stderr
    assert_quiet(proc)
    found = records(proc.stdout, 4)
    first = assert_agree(found)
    assert first["nodes"] == 1 and len(first["node_names"]) == 1
    assert first["node_of"] == [0, 0, 0, 0]
    assert first["roles"] == ["preprocessor", "preprocessor", "trainer", "trainer"]
    assert first["gpus"] == [None, None, 0, 1]
    assert [r["device"] for r in found] == ["cpu"] * 4
    assert [r["env"]["local_rank"] for r in found] == [0, 1, 2, 3]


@pytest.mark.openmpi
@pytest.mark.mpi
@pytest.mark.parametrize(
    "how", [["--ranks-per-node", "3"], ["--virtual"]], ids=["ranks-per-node", "virtual-nodes"]
)
def test_virtual_nodes_split_one_machine(how):
    proc = run_probe(6, "--nodes", "2", "--gpus-per-node", "2", "--preprocessors", "1", *how)
    assert proc.returncode == 0, proc.stderr
    assert_quiet(proc)
    first = assert_agree(records(proc.stdout, 6))
    assert first["nodes"] == 2 and first["node_names"] == []
    assert first["node_of"] == [0, 0, 0, 1, 1, 1]
    assert first["roles"] == ["preprocessor", "trainer", "trainer"] * 2
    assert first["gpus"] == [None, 0, 1, None, 2, 3]


@pytest.mark.openmpi
@pytest.mark.mpi
@pytest.mark.parametrize(
    "n, args, line",
    [
        (
            6,
            ["--nodes", "2", "--gpus-per-node", "2", "--preprocessors", "1"],
            "fleet run: error: cluster: the job has 6 ranks on 1 node; the spec needs 2 nodes x "
            "(2 trainers + 1 preprocessor) = 6 ranks (launch with 3 ranks per node on 2 nodes, or "
            "set cluster.nodes: 1, or cluster.virtual_nodes: true to split this machine)",
        ),
        (
            4,
            ["--nodes", "3", "--virtual"],
            "fleet run: error: cluster.virtual_nodes: the job's 4 ranks do not split evenly into "
            "cluster.nodes: 3 (launch with a multiple of 3 ranks)",
        ),
    ],
    ids=["hostname-mismatch", "virtual-uneven"],
)
def test_mismatch_ends_every_rank_with_2_and_one_line(n, args, line):
    proc = run_probe(n, *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [line]
    assert records(proc.stdout, n) == [{"rank": r, "exit": 2} for r in range(n)]
    assert_quiet(proc)


def foreign_launcher_env(rank: int, size: int) -> dict[str, str]:
    """What a launcher of another MPI than mpi4py's sets: Open MPI's under MPICH, Hydra's under Open MPI."""
    from fleet.runtime.launch.process import mpi_library

    if mpi_library().startswith("MPICH"):
        return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
                "OMPI_COMM_WORLD_LOCAL_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_SIZE": str(size)}
    return {"PMI_RANK": str(rank), "PMI_SIZE": str(size)}


def tiny_spec(tmp_path: Path) -> Path:
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "name: x\ndata: {source: digits}\nmodels: [{family: mlp}]\ntrain: {max_epochs: 1}\n"
        "cluster: {nodes: 1, gpus_per_node: 2, preprocessors_per_node: 1}\n"
    )
    return spec


def train_as_ranks_0_and_1(tmp_path: Path, run_dir: Path, env_of) -> list[subprocess.CompletedProcess]:
    """`fleet train` on `tiny_spec`, started one after the other as ranks 0 and 1 of a
    launch of 3 that `env_of(rank)` describes (no real launcher)."""
    spec = tiny_spec(tmp_path)
    return [
        subprocess.run([sys.executable, "-m", "fleet", "train", str(spec), "--run-dir", str(run_dir)],
                       cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env_of(rank))
        for rank in (0, 1)
    ]


@pytest.mark.openmpi
@pytest.mark.mpi
def test_another_mpis_launcher_is_one_line_from_its_rank_0_and_exit_2_everywhere(tmp_path):
    """mpi4py built for one MPI, started by another's launcher: each rank is a world of one. The
    launcher's rank 0 says so in one line; the others exit 2 quietly; no run directory is made."""
    run_dir = tmp_path / "run"
    procs = train_as_ranks_0_and_1(tmp_path, run_dir, lambda rank: mpi_env(foreign_launcher_env(rank, 3)))
    assert [p.returncode for p in procs] == [2, 2], procs
    lines = procs[0].stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fleet train: error: launch: the launcher "), lines
    assert "started 3 ranks but MPI sees 1 in each: mpi4py is built with " in lines[0]
    assert procs[1].stderr == "" and not run_dir.exists()


def two_node_slurm_allocation(job_id: str = "4242") -> dict[str, str]:
    """What a shell inside ``salloc -N 2 --ntasks-per-node 2`` has: this host and one more."""
    import socket

    nodes = f"{socket.gethostname()},fleet-ghost-node"
    return {"SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id, "SLURM_NODELIST": nodes, "SLURM_JOB_NODELIST": nodes,
            "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "4", "SLURM_TASKS_PER_NODE": "2(x2)"}


@pytest.mark.openmpi
@pytest.mark.mpi
def test_fleet_run_inside_a_multi_node_allocation_starts_every_rank_here(tmp_path):
    """Open MPI's mpirun would start a daemon on the other node with srun, and Hydra with
    ``-launcher fork`` would tell rank 2 it runs on the other node (PMI_HOSTNAME); `fleet run`
    hides the allocation from its mpiexec and says so."""
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "fleet", "run", str(tiny_spec(tmp_path)), "--run-dir", str(run_dir), "--quiet"],
        cwd=REPO, capture_output=True, text=True, timeout=240, env=mpi_env(two_node_slurm_allocation()),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0] == (
        "fleet: slurm job 4242 has 2 nodes; this command starts every rank on this one "
        "(for all of them: `fleet submit`, or `fleet train` under srun/jsrun)")
    results = json.loads((run_dir / "results.json").read_text())
    assert [m["epochs"] for m in results["models"]] == [1]


PMIX_LINE = ("fleet train: error: launch: the launcher (openmpi) speaks PMIx, and mpi4py's MPI (MPICH {}) is built "
             "without it, so MPI_Init would abort every rank: start the job with MPICH's mpiexec (or srun "
             "--mpi=pmi2), or give mpi4py the launcher's MPI (its wheel: MPI4PY_LIBMPI=libmpi.so.40 for Open MPI; "
             "or MPICC=mpicc pip install --no-binary=mpi4py mpi4py)")


def mpich_without_pmix() -> tuple[dict[str, str], str]:
    """An environment in which mpi4py loads MPICH built without PMIx (the mpich wheel's: also
    in the Open MPI leg, without its MPI4PY_LIBMPI), and that MPICH's version; skips otherwise."""
    env = mpi_env()
    env.pop("MPI4PY_LIBMPI", None)
    probe = subprocess.run(
        [sys.executable, "-c", "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
         "print(MPI.Get_library_version())"], capture_output=True, text=True, env=env, timeout=60)
    from fleet.runtime.launch.topology import _mpich_without_pmix

    if probe.returncode != 0 or not _mpich_without_pmix(probe.stdout):
        pytest.skip("mpi4py does not load an MPICH without PMIx here")
    return env, probe.stdout.split("\n", 1)[0].partition(":")[2].strip()


@pytest.mark.mpi
def test_mpich_under_a_pmix_launcher_is_one_line_before_mpi_init(tmp_path):
    """What Open MPI's mpirun gives each rank (PMIx and OMPI_COMM_WORLD_*), with the mpich
    wheel's mpi4py: MPICH's MPI_Init would abort every rank with its own error stack; fleet
    says why in one line from rank 0, and every rank exits 2 before MPI_Init."""
    env, version = mpich_without_pmix()
    run_dir = tmp_path / "run"
    procs = train_as_ranks_0_and_1(tmp_path, run_dir, lambda rank: {
        **env, "PMIX_NAMESPACE": "prterun-x-1@1", "PMIX_RANK": str(rank), "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_LOCAL_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_SIZE": "3"})
    assert [p.returncode for p in procs] == [2, 2], procs
    assert procs[0].stderr.splitlines() == [PMIX_LINE.format(version)]
    assert procs[1].stderr == "" and not run_dir.exists()


@pytest.mark.mpi
def test_the_mpich_wheel_under_open_mpis_mpirun_is_one_line(tmp_path):
    """The same under a real Open MPI mpirun (``--quiet``: no block of its own)."""
    launcher = shutil.which("mpiexec.openmpi") or pytest.skip("no Open MPI mpiexec.openmpi on PATH")
    env, version = mpich_without_pmix()
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = subprocess.run(
        [launcher, "--quiet", "--oversubscribe", "-n", "3", sys.executable, "-m", "fleet", "train",
         str(tiny_spec(tmp_path)), "--run-dir", str(tmp_path / "run")],
        cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [PMIX_LINE.format(version)]
    assert not (tmp_path / "run").exists()
