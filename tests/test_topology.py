"""Roles, GPU numbering and fit checks of the rank topology (pure: no MPI)."""

from __future__ import annotations

import pytest

from fleet.errors import UserError
from fleet.runtime.launch.jobenv import JobEnv, Launcher
from fleet.runtime.launch.topology import (
    RankPlacement,
    Role,
    Topology,
    LaunchMismatch,
    TopologyError,
    assign_roles,
    bind_device,
    check_launch,
    check_library,
    node_of_rank_virtual,
    number_nodes,
)
from fleet.spec import ClusterSpec

P, T = Role.PREPROCESSOR, Role.TRAINER


def cluster(nodes=1, gpus_per_node=2, preprocessors_per_node=1, **extra) -> ClusterSpec:
    return ClusterSpec(
        nodes=nodes, gpus_per_node=gpus_per_node, preprocessors_per_node=preprocessors_per_node, **extra
    )


def test_one_node():
    topology = assign_roles([0, 0, 0], cluster())
    assert topology.placements == (
        RankPlacement(0, 0, 0, P, preprocessor_index=0),
        RankPlacement(1, 0, 1, T, trainer_index=0, gpu=0),
        RankPlacement(2, 0, 2, T, trainer_index=1, gpu=1),
    )
    assert (topology.nodes, topology.gpus_per_node, topology.preprocessors_per_node) == (1, 2, 1)
    assert (topology.size, topology.gpus) == (3, 2)


def test_two_nodes_in_blocks():
    topology = assign_roles([0, 0, 0, 1, 1, 1], cluster(nodes=2))
    assert [p.role for p in topology.placements] == [P, T, T, P, T, T]
    assert [p.node for p in topology.placements] == [0, 0, 0, 1, 1, 1]
    assert [p.gpu for p in topology.placements] == [None, 0, 1, None, 2, 3]
    assert [p.preprocessor_index for p in topology.placements] == [0, None, None, 1, None, None]
    assert topology.trainer_ranks() == [1, 2, 4, 5]
    assert topology.trainer_ranks(node=1) == [4, 5]
    assert topology.preprocessor_ranks() == [0, 3]
    assert topology.preprocessor_ranks(node=0) == [0]


def test_round_robin_ranks_and_node_labels_numbered_by_lowest_rank():
    """Ranks dealt cyclically over two hosts; the host of rank 0 is node 0 whatever its label."""
    topology = assign_roles([7, 3, 7, 3, 7, 3], cluster(nodes=2))
    assert [p.node for p in topology.placements] == [0, 1, 0, 1, 0, 1]
    assert [p.local_rank for p in topology.placements] == [0, 0, 1, 1, 2, 2]
    assert [p.role for p in topology.placements] == [P, P, T, T, T, T]
    assert [p.gpu for p in topology.placements] == [None, None, 0, 2, 1, 3]
    assert topology.trainer_ranks() == [2, 4, 3, 5]
    assert topology.preprocessor_ranks() == [0, 1]


def test_number_nodes():
    assert number_nodes(["b", "a", "b", "c", "a"]) == [0, 1, 0, 2, 1]


@pytest.mark.parametrize("ranks_per_node, preprocessors", [(3, 1), (4, 2), (6, 4)])
def test_auto_preprocessors_take_the_ranks_left(ranks_per_node, preprocessors):
    spec = cluster(nodes=2, preprocessors_per_node="auto")
    topology = assign_roles([0] * ranks_per_node + [1] * ranks_per_node, spec)
    assert topology.preprocessors_per_node == preprocessors
    assert len(topology.preprocessor_ranks()) == 2 * preprocessors
    assert topology.trainer_ranks(node=1) == [ranks_per_node + preprocessors, ranks_per_node + preprocessors + 1]


def test_fixed_preprocessors():
    topology = assign_roles([0] * 5, cluster(gpus_per_node=3, preprocessors_per_node=2))
    assert [p.role for p in topology.placements] == [P, P, T, T, T]
    assert [p.trainer_index for p in topology.placements] == [None, None, 0, 1, 2]


def test_gpu_numbering_and_inverse():
    spec = cluster(nodes=3, gpus_per_node=4, preprocessors_per_node=2)
    topology = assign_roles([n for n in range(3) for _ in range(6)], spec)
    for placement in topology.placements:
        if placement.role is T:
            assert placement.gpu == placement.node * 4 + placement.trainer_index
            assert topology.trainer_rank(placement.gpu) == placement.rank
            assert topology.gpu_of(placement.rank) == placement.gpu
        else:
            assert topology.gpu_of(placement.rank) is None
        assert topology.node_of(placement.rank) == placement.node
        assert topology.role_of(placement.rank) is placement.role
    assert sorted(topology.gpu_of(r) for r in topology.trainer_ranks()) == list(range(12))
    with pytest.raises(ValueError, match="no trainer slot 12"):
        topology.trainer_rank(12)


def test_describe():
    topology = assign_roles([0, 0, 0, 1, 1, 1], cluster(nodes=2))
    assert topology.describe() == (
        "topology: 2 nodes x (2 trainers + 1 preprocessor) = 6 ranks\n"
        "  node 0: preprocessors 0; trainers 1 (gpu 0), 2 (gpu 1)\n"
        "  node 1: preprocessors 3; trainers 4 (gpu 2), 5 (gpu 3)"
    )
    named = Topology(topology.placements, 2, 2, 1, node_names=("a", "b"))
    assert named.describe().splitlines()[2] == "  node 1 (b): preprocessors 3; trainers 4 (gpu 2), 5 (gpu 3)"


# --- fit errors -------------------------------------------------------------------------


def fit_error(node_of_rank, spec) -> str:
    with pytest.raises(TopologyError) as caught:
        assign_roles(node_of_rank, spec)
    message = str(caught.value)
    assert isinstance(caught.value, UserError) and caught.value.exit_code == 2
    assert message.startswith("cluster") and "\n" not in message
    return message


def test_wrong_node_count():
    assert fit_error([0] * 6, cluster(nodes=2)) == (
        "cluster: the job has 6 ranks on 1 node; the spec needs 2 nodes x (2 trainers + 1 preprocessor) "
        "= 6 ranks (launch with 3 ranks per node on 2 nodes, or set cluster.nodes: 1, "
        "or cluster.virtual_nodes: true to split this machine)"
    )


def test_wrong_node_count_auto_and_many_nodes():
    message = fit_error([0, 0, 0, 1, 1, 1, 2, 2, 2], cluster(nodes=2, preprocessors_per_node="auto"))
    assert message == (
        "cluster: the job has 9 ranks on 3 nodes (3 per node); the spec needs 2 nodes x "
        "(2 trainers + at least 1 preprocessor) = at least 6 ranks (launch with at least 3 ranks "
        "per node on 2 nodes, or set cluster.nodes: 3)"
    )


def test_too_few_ranks_for_a_preprocessor():
    assert fit_error([0, 0], cluster(preprocessors_per_node="auto")) == (
        "cluster: the job has 2 ranks on 1 node; the spec needs 1 node x (2 trainers + at least 1 "
        "preprocessor) = at least 3 ranks, and every node needs at least one preprocessor (launch "
        "with at least 3 ranks per node, or set cluster.gpus_per_node: 1)"
    )


def test_one_rank_is_never_enough():
    message = fit_error([0], cluster(gpus_per_node=1))
    assert "the job has 1 rank on 1 node" in message and "at least 2 ranks per node" in message
    assert "gpus_per_node: 0" not in message


def test_unequal_ranks_per_node():
    assert fit_error([0, 0, 0, 0, 1, 1, 1], cluster(nodes=2, preprocessors_per_node="auto")) == (
        "cluster: the job has 7 ranks on 2 nodes (4 + 3); the spec needs 2 nodes x (2 trainers + "
        "at least 1 preprocessor) = at least 6 ranks, the same on every node (launch the same "
        "number of ranks on each node, e.g. srun --ntasks-per-node or mpiexec -ppn)"
    )


def test_unequal_ranks_on_many_nodes_are_summarised():
    node_of_rank = [n for n in range(10) for _ in range(3)] + [9]
    message = fit_error(node_of_rank, cluster(nodes=10))
    assert "the job has 31 ranks on 10 nodes (3 to 4 per node)" in message


def test_fixed_preprocessors_do_not_fill_the_node():
    assert fit_error([0] * 4 + [1] * 4, cluster(nodes=2)) == (
        "cluster: the job has 8 ranks on 2 nodes (4 per node); the spec needs 2 nodes x (2 trainers "
        "+ 1 preprocessor) = 6 ranks (launch with 3 ranks per node, or set "
        "cluster.preprocessors_per_node: 2 or auto)"
    )


def test_fixed_preprocessors_more_than_the_node_has():
    message = fit_error([0] * 4, cluster(gpus_per_node=2, preprocessors_per_node=3))
    assert message.endswith("(launch with 5 ranks per node, or set cluster.preprocessors_per_node: 2 or auto)")
    assert "1 node x (2 trainers + 3 preprocessors) = 5 ranks" in message


def test_virtual_nodes():
    assert node_of_rank_virtual(6, 3) == [0, 0, 0, 1, 1, 1]
    assert node_of_rank_virtual(4, 4) == [0, 0, 0, 0]
    topology = assign_roles(node_of_rank_virtual(8, 4), cluster(nodes=2, preprocessors_per_node="auto"))
    assert topology.preprocessor_ranks() == [0, 1, 4, 5]


@pytest.mark.parametrize(
    "size, ranks_per_node, text", [(7, 3, "do not split into nodes of 3"), (6, 0, "positive integer")]
)
def test_virtual_nodes_that_do_not_split(size, ranks_per_node, text):
    with pytest.raises(TopologyError, match=text) as caught:
        node_of_rank_virtual(size, ranks_per_node)
    assert str(caught.value).startswith("cluster")


# --- devices ----------------------------------------------------------------------------

TRAINER_1 = RankPlacement(rank=5, node=1, local_rank=2, role=T, trainer_index=1, gpu=3)
PREPROCESSOR = RankPlacement(rank=3, node=1, local_rank=0, role=P, preprocessor_index=1)
CUDA = cluster(nodes=2, device="cuda")


def env_with(devices: tuple[str, ...] | None) -> JobEnv:
    return JobEnv(cuda_visible_devices=devices)


def test_cpu_and_emulated_devices_and_preprocessors_use_the_cpu():
    assert bind_device(TRAINER_1, cluster(device="cpu"), env_with(None)) == "cpu"
    assert bind_device(TRAINER_1, cluster(device="emulated"), env_with(())) == "cpu"
    assert bind_device(PREPROCESSOR, CUDA, env_with(("0", "1"))) == "cpu"


def test_trainer_index_through_all_visible_gpus():
    assert bind_device(TRAINER_1, CUDA, env_with(None)) == "cuda:1"
    assert bind_device(TRAINER_1, CUDA, env_with(None), visible_gpu_count=2) == "cuda:1"
    assert bind_device(TRAINER_1, CUDA, env_with(("2", "3"))) == "cuda:1"


def test_one_gpu_per_task_is_cuda_0():
    """srun --gpus-per-task=1 or a jsrun resource set of one GPU: the task sees only its GPU."""
    assert bind_device(TRAINER_1, CUDA, env_with(("3",))) == "cuda:0"
    assert bind_device(TRAINER_1, CUDA, env_with(("GPU-1234abcd",)), visible_gpu_count=1) == "cuda:0"


@pytest.mark.parametrize(
    "devices, count, shown",
    [
        (("0",), 0, "'0'"),
        ((), None, "''"),
        (None, 1, "unset"),
        (("0", "1", "2"), 1, "'0,1,2'"),
    ],
)
def test_too_few_visible_gpus(devices, count, shown):
    with pytest.raises(TopologyError) as caught:
        bind_device(TRAINER_1, CUDA, env_with(devices), visible_gpu_count=count)
    message = str(caught.value)
    seen = count if count is not None else len(devices)
    assert message.startswith("cluster.gpus_per_node: 2 trainers per node, but rank 5 (trainer 1 on node 1) sees ")
    assert f"sees {seen} GPU" in message and f"CUDA_VISIBLE_DEVICES {shown}" in message
    assert "\n" not in message


def test_one_rank_world_under_a_launcher_of_several_is_a_mismatch_said_by_its_rank_0():
    for rank in (0, 2):
        env = JobEnv(launcher=Launcher.OPENMPI, rank=rank, size=3)
        with pytest.raises(LaunchMismatch, match=r"^launch: the launcher \(openmpi\) started 3 ranks but MPI "
                           r"sees 1 in each: mpi4py is built with MPICH 5.0.2,") as caught:
            check_launch(1, env, "MPICH 5.0.2")
        assert caught.value.prints is (rank == 0)
        assert caught.value.exit_code == 2


@pytest.mark.parametrize("world, size", [(1, 1), (1, None), (4, 4), (4, 1)])
def test_a_world_the_launcher_agrees_with_or_cannot_judge_is_no_mismatch(world, size):
    check_launch(world, JobEnv(launcher=Launcher.MPICH, rank=0, size=size), "Open MPI 4.1.4")


WHEEL_MPICH = ("MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25 20:45:26 UTC 2026\n"
               "MPICH Device:       ch4:ucx ofi\nMPICH configure:    --with-device=ch4:ucx,ofi --with-pm=hydra:gforker\n")


def test_mpich_without_pmix_under_a_pmix_launcher_is_refused_before_mpi_init():
    for rank in (0, 2):
        with pytest.raises(LaunchMismatch) as caught:
            check_library(JobEnv(launcher=Launcher.OPENMPI, rank=rank, size=3, pmix=True), WHEEL_MPICH)
        assert caught.value.prints is (rank == 0) and caught.value.exit_code == 2
    assert str(caught.value).startswith("launch: the launcher (openmpi) speaks PMIx, and mpi4py's MPI (MPICH 5.0.2) "
                                        "is built without it, so MPI_Init would abort every rank: ")
    with pytest.raises(LaunchMismatch, match=r"^launch: the launcher \(slurm\) speaks PMIx"):
        check_library(JobEnv(launcher=Launcher.SLURM, rank=0, size=4, pmix=True), WHEEL_MPICH)


@pytest.mark.parametrize("env, library", [
    (JobEnv(launcher=Launcher.OPENMPI, size=3, pmix=True), WHEEL_MPICH.replace("gforker", "gforker --with-pmix=/usr")),
    (JobEnv(launcher=Launcher.OPENMPI, size=3, pmix=True), "Open MPI v4.1.4, package: Debian OpenMPI"),
    (JobEnv(launcher=Launcher.OPENMPI, size=3, pmix=True), "MPICH Version: 4.2.0\n"),  # no configure line: cannot tell
    (JobEnv(launcher=Launcher.SLURM, size=3, pmix=True), "MPI VERSION    : CRAY MPICH version 8.1.28"),
    (JobEnv(launcher=Launcher.MPICH, size=3, pmix=True), WHEEL_MPICH),  # Hydra's own PMI wins
    (JobEnv(launcher=Launcher.SLURM, size=3, pmix=False), WHEEL_MPICH),  # srun --mpi=pmi2
], ids=["mpich-with-pmix", "open-mpi", "no-configure-line", "cray-mpich", "hydra", "no-pmix"])
def test_what_mpi_init_can_start_is_not_refused(env, library):
    check_library(env, library)
