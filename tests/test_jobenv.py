"""The job-environment adapter: one table per launcher, the innermost launcher wins."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleet.errors import UserError
from fleet.runtime.launch.jobenv import (
    JobEnv,
    JobEnvError,
    Launcher,
    Scheduler,
    expand_hostlist,
    parse_cuda_visible_devices,
    parse_tasks_per_node,
    read_job_env,
    without_allocation,
)

# What a batch script of `sbatch -N 2 --ntasks-per-node 3 --cpus-per-task 4` sees (first node).
SBATCH = {
    "SLURM_JOB_ID": "123456",
    "SLURM_JOBID": "123456",
    "SLURM_JOB_NAME": "fleet",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_JOB_NODELIST": "nid[0001-0002]",
    "SLURM_NODELIST": "nid[0001-0002]",
    "SLURM_NTASKS": "6",
    "SLURM_NPROCS": "6",
    "SLURM_NTASKS_PER_NODE": "3",
    "SLURM_TASKS_PER_NODE": "3(x2)",
    "SLURM_CPUS_PER_TASK": "4",
    "SLURM_CPUS_ON_NODE": "12",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_GTIDS": "0",
    "SLURMD_NODENAME": "nid0001",
    "SLURM_SUBMIT_DIR": "/home/user/run",
}

# `srun --gpus-per-task=1` inside it, task 4 (second node, second task there).
SRUN_TASK_4 = {
    **SBATCH,
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_PROCID": "4",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_NUM_TASKS": "6",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NODELIST": "nid[0001-0002]",
    "SLURM_STEP_TASKS_PER_NODE": "3(x2)",
    "SLURMD_NODENAME": "nid0002",
    "SLURM_TASK_PID": "4242",
    "CUDA_VISIBLE_DEVICES": "1",
}

# What MPICH's Hydra proxy sets for rank 5 of `mpiexec -n 8` (4 per node, second host).
HYDRA_RANK_5 = {
    "PMI_RANK": "5",
    "PMI_SIZE": "8",
    "PMI_FD": "9",
    "MPI_LOCALRANKID": "1",
    "MPI_LOCALNRANKS": "4",
    "PMI_HOSTNAME": "nid0002",
}

OPENMPI_RANK_3 = {
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "OMPI_COMM_WORLD_NODE_RANK": "1",
    "OMPI_UNIVERSE_SIZE": "4",
    "PMIX_RANK": "3",
    "PMIX_NAMESPACE": "prterun-host-1234@1",
}

# `jsrun -n 12 -r 6 -g 1` on Summit (Spectrum MPI adds OMPI_COMM_WORLD_*), task 7.
JSRUN_TASK_7 = {
    "LSB_JOBID": "99887",
    "LSB_MCPU_HOSTS": "batch1 1 a01n01 42 a01n02 42",
    "LSB_HOSTS": "batch1 a01n01 a01n01 a01n02 a01n02",
    "JSM_NAMESPACE_RANK": "7",
    "JSM_NAMESPACE_SIZE": "12",
    "JSM_NAMESPACE_LOCAL_RANK": "1",
    "JSM_NAMESPACE_LOCAL_SIZE": "6",
    "OMPI_COMM_WORLD_RANK": "7",
    "OMPI_COMM_WORLD_SIZE": "12",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "6",
    "PMIX_RANK": "7",
    "CUDA_VISIBLE_DEVICES": "0",
}


def test_no_launcher_is_a_singleton():
    env = read_job_env({"HOME": "/home/user", "PATH": "/usr/bin"})
    assert env == JobEnv()
    assert (env.launcher, env.rank, env.size, env.local_rank, env.local_size) == (Launcher.UNKNOWN, 0, 1, 0, 1)
    assert env.scheduler is Scheduler.NONE and env.job_id is None
    assert env.cuda_visible_devices is None and not env.restarted


def test_srun_task():
    env = read_job_env({**SRUN_TASK_4, "SLURM_RESTART_COUNT": "2"})
    assert env.launcher is Launcher.SLURM
    assert (env.rank, env.size, env.local_rank, env.local_size) == (4, 6, 1, 3)
    assert (env.node_index, env.node_count, env.node_name, env.step_id) == (1, 2, "nid0002", "0")
    assert env.scheduler is Scheduler.SLURM and env.job_id == "123456"
    assert env.job_nodes == 2 and env.job_hosts == ("nid0001", "nid0002")
    assert (env.ntasks_per_node, env.cpus_per_task) == (3, 4)
    assert env.restart_count == 2 and env.restarted
    assert env.cuda_visible_devices == ("1",)


def test_srun_uneven_tasks_per_node_gives_this_nodes_count():
    env = read_job_env({**SRUN_TASK_4, "SLURM_NODEID": "2", "SLURM_STEP_NUM_NODES": "3",
                        "SLURM_STEP_TASKS_PER_NODE": "2(x2),1", "SLURM_PROCID": "4", "SLURM_LOCALID": "0"})
    assert (env.node_index, env.local_size) == (2, 1)


def test_srun_without_restart_count_is_a_first_run():
    env = read_job_env(SRUN_TASK_4)
    assert env.restart_count is None and not env.restarted


@pytest.mark.parametrize("step", [None, "4294967291", "4294967292", "4294967290", "4294967294", "4294967295"])
def test_batch_script_alone_is_a_singleton_in_a_slurm_job(step):
    """The batch step has SLURM_PROCID=0 and SLURM_NTASKS=6, but no srun started this process."""
    environ = dict(SBATCH) if step is None else {**SBATCH, "SLURM_STEP_ID": step}
    env = read_job_env(environ)
    assert (env.launcher, env.rank, env.size) == (Launcher.UNKNOWN, 0, 1)
    assert env.scheduler is Scheduler.SLURM and env.job_id == "123456" and env.job_nodes == 2


def test_mpich_mpiexec_on_a_workstation():
    env = read_job_env({**HYDRA_RANK_5, "PMI_HOSTNAME": "vm"})
    assert env.launcher is Launcher.MPICH
    assert (env.rank, env.size, env.local_rank, env.local_size) == (5, 8, 1, 4)
    assert env.node_name == "vm" and env.node_index is None and env.node_count is None
    assert env.scheduler is Scheduler.NONE and env.job_id is None


def test_mpich_mpiexec_inside_sbatch_does_not_trust_slurm_procid():
    """Hydra forwards the batch script's environment and starts its proxies with srun: the
    ranks see SLURM_PROCID (of the batch step or a proxy) and a SLURM_STEP_ID, but Hydra's
    PMI_RANK is the rank."""
    environ = {**SBATCH, "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", **HYDRA_RANK_5}
    env = read_job_env(environ)
    assert env.launcher is Launcher.MPICH
    assert (env.rank, env.size, env.local_rank, env.local_size) == (5, 8, 1, 4)
    assert env.node_name == "nid0002"  # Hydra's host, not the batch host's SLURMD_NODENAME
    assert env.node_index is None and env.step_id is None
    assert env.scheduler is Scheduler.SLURM and env.job_id == "123456"
    assert env.cpus_per_task == 4


def test_hydra_with_pmi_port_gives_pmi_id():
    environ = {k: v for k, v in HYDRA_RANK_5.items() if k not in ("PMI_RANK", "PMI_FD")}
    env = read_job_env({**environ, "PMI_ID": "5", "PMI_PORT": "host:1234"})
    assert (env.launcher, env.rank) == (Launcher.MPICH, 5)


def test_openmpi_mpirun():
    env = read_job_env(OPENMPI_RANK_3)
    assert env.launcher is Launcher.OPENMPI
    assert (env.rank, env.size, env.local_rank, env.local_size) == (3, 4, 1, 2)
    # OMPI_COMM_WORLD_NODE_RANK is a node-local rank across jobs, not a node index.
    assert env.node_index is None and env.node_name is None


def test_openmpi_mpirun_inside_slurm():
    """mpirun's daemons are srun tasks: their SLURM_PROCID/STEP_ID leak into the ranks."""
    env = read_job_env({**SRUN_TASK_4, "SLURM_PROCID": "1", **OPENMPI_RANK_3})
    assert (env.launcher, env.rank, env.size) == (Launcher.OPENMPI, 3, 4)
    assert env.scheduler is Scheduler.SLURM and env.job_id == "123456"


def test_jsrun_task():
    env = read_job_env(JSRUN_TASK_7)
    assert env.launcher is Launcher.LSF
    assert (env.rank, env.size, env.local_rank, env.local_size) == (7, 12, 1, 6)
    assert env.scheduler is Scheduler.LSF and env.job_id == "99887"
    assert env.job_hosts == ("batch1", "a01n01", "a01n02") and env.job_nodes == 3
    assert env.cuda_visible_devices == ("0",)


def test_lsf_hosts_from_lsb_hosts_when_no_mcpu_hosts():
    environ = {k: v for k, v in JSRUN_TASK_7.items() if k != "LSB_MCPU_HOSTS"}
    assert read_job_env(environ).job_hosts == ("batch1", "a01n01", "a01n02")


def test_srun_inside_an_lsf_job_is_slurm():
    env = read_job_env({**SRUN_TASK_4, "LSB_JOBID": "5"})
    assert (env.launcher, env.scheduler, env.job_id) == (Launcher.SLURM, Scheduler.SLURM, "123456")


@pytest.mark.parametrize(
    "extra", [{"PMIX_RANK": "4", "PMIX_NAMESPACE": "slurm.pmix.1.0"}, {"PMI_RANK": "4", "PMI_SIZE": "6"}]
)
def test_srun_with_pmix_or_pmi2_plugin_is_slurm(extra):
    env = read_job_env({**SRUN_TASK_4, **extra})
    assert (env.launcher, env.rank, env.local_rank) == (Launcher.SLURM, 4, 1)


def test_pmi_launcher_without_hydra():
    env = read_job_env({"PMI_RANK": "2", "PMI_SIZE": "3", "PMI_FD": "5"})
    assert (env.launcher, env.rank, env.size, env.local_rank) == (Launcher.MPICH, 2, 3, None)


def test_pmix_alone_gives_the_rank_only():
    env = read_job_env({"PMIX_RANK": "2", "PMIX_NAMESPACE": "prun.1"})
    assert (env.launcher, env.rank, env.size, env.local_rank) == (Launcher.PMIX, 2, None, None)


@pytest.mark.parametrize(
    "environ, variable",
    [
        ({**HYDRA_RANK_5, "PMI_RANK": "five"}, "PMI_RANK"),
        ({**SRUN_TASK_4, "SLURM_LOCALID": "-1"}, "SLURM_LOCALID"),
        ({**OPENMPI_RANK_3, "OMPI_COMM_WORLD_RANK": "4"}, "OMPI_COMM_WORLD_RANK"),
        ({**JSRUN_TASK_7, "JSM_NAMESPACE_LOCAL_RANK": "6"}, "JSM_NAMESPACE_LOCAL_RANK"),
    ],
)
def test_unreadable_launcher_variable_is_a_one_line_error_naming_it(environ, variable):
    with pytest.raises(JobEnvError) as caught:
        read_job_env(environ)
    assert isinstance(caught.value, UserError) and caught.value.exit_code == 2
    message = str(caught.value)
    assert variable in message and "\n" not in message and message.startswith("job environment")


def test_unreadable_batch_information_is_left_out():
    env = read_job_env({**SRUN_TASK_4, "SLURM_CPUS_PER_TASK": "four", "SLURM_JOB_NODELIST": "n[1-"})
    assert env.cpus_per_task is None and env.job_hosts is None and env.job_nodes == 2


@pytest.mark.parametrize(
    "value, devices",
    [
        ("", ()),
        ("0", ("0",)),
        ("0,1,2,3", ("0", "1", "2", "3")),
        (" 2 , 3 ", ("2", "3")),
        ("3,1", ("3", "1")),
        ("-1", ()),
        ("0,-1,2", ("0",)),
        ("NoDevFiles", ()),
        ("GPU-8f6b2c4e-1d2a-4c5e-9f00-123456789abc,1", ("GPU-8f6b2c4e-1d2a-4c5e-9f00-123456789abc", "1")),
        ("MIG-GPU-8f6b2c4e-1d2a/1/0", ("MIG-GPU-8f6b2c4e-1d2a/1/0",)),
    ],
)
def test_cuda_visible_devices(value, devices):
    assert parse_cuda_visible_devices(value) == devices
    assert read_job_env({"CUDA_VISIBLE_DEVICES": value}).cuda_visible_devices == devices


def test_cuda_visible_devices_unset_is_none():
    assert read_job_env({}).cuda_visible_devices is None


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("nid0001", ("nid0001",)),
        ("n[1-3]", ("n1", "n2", "n3")),
        ("n[08-11,20]", ("n08", "n09", "n10", "n11", "n20")),
        ("a[1-2]-ib[0-1],login", ("a1-ib0", "a1-ib1", "a2-ib0", "a2-ib1", "login")),
        ("x,y", ("x", "y")),
        ("n[1-", None),
        ("n[a-b]", None),
    ],
)
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


def test_parse_tasks_per_node():
    assert parse_tasks_per_node("2(x3),1") == (2, 2, 2, 1)
    assert parse_tasks_per_node("4") == (4,)
    with pytest.raises(ValueError):
        parse_tasks_per_node("2(3)")


def test_str_names_launcher_rank_and_job():
    text = str(read_job_env({**SBATCH, **HYDRA_RANK_5}))
    assert text == "JobEnv(launcher mpich, rank 5/8, local 1/4, node nid0002, slurm job 123456)"


_PREFIX = r"(?:SLURM_|SLURMD_|OMPI_COMM_WORLD|PMI_|PMIX_|MPI_LOCAL|JSM_|LSB_|CUDA_VISIBLE_DEVICES)[A-Z0-9_]*"
LAUNCHER_VARIABLE = re.compile(
    rf"""environ\s*\[\s*["']{_PREFIX}["']\s*\](?!\s*=[^=])"""  # os.environ["X"], not a write
    rf"""|(?:environ\.get|getenv)\(\s*["']{_PREFIX}["']"""  # os.environ.get("X"), os.getenv("X")
    rf"""|["']{_PREFIX}["']\s+(?:not\s+)?in\s+(?:os\.)?environ\b"""  # "X" in os.environ
)


def test_no_other_module_reads_launcher_variables():
    """STYLE item 6: jobenv.py is the one adapter; nothing else reads os.environ["SLURM_..."]."""
    package = Path(__file__).resolve().parent.parent / "fleet"
    readers = [
        str(path.relative_to(package.parent))
        for path in package.rglob("*.py")
        if path.name != "jobenv.py" and LAUNCHER_VARIABLE.search(path.read_text(encoding="utf-8"))
    ]
    assert readers == []


def test_without_allocation_hides_the_batch_system_from_an_inner_mpiexec():
    environ = {**SBATCH, "LSB_JOBID": "7", "LSB_MCPU_HOSTS": "a 2 b 2", "PBS_NODEFILE": "/x", "PE_HOSTFILE": "/y",
               "PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1", "OMPI_MCA_btl": "self,vader", "SLURMD_NODENAME": "nid0001"}
    assert without_allocation(environ) == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1", "OMPI_MCA_btl": "self,vader",
                                           "SLURMD_NODENAME": "nid0001"}
    assert read_job_env(without_allocation(environ)).scheduler is Scheduler.NONE


def test_a_pmix_server_is_seen_whatever_launcher_it_is():
    assert read_job_env({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "PMIX_NAMESPACE": "n"}).pmix
    assert read_job_env({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "PMIX_RANK": "0"}).pmix
    assert not read_job_env({"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0"}).pmix
