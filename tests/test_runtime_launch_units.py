"""Launching a job without processes: the mpiexec command, allocations, the launcher's choice,
and the per-rank entry point's device override."""

import shutil

import pytest

from fleet.errors import UserError
from fleet.runtime.launch.mpiexec import allocation_note, find_mpiexec, local_launch_flags, mpiexec_command
from fleet.spec import parse_spec


def test_mpiexec_command_for_one_and_several_nodes():
    spec = parse_spec({"name": "q", "data": {"source": "digits"}, "models": [{"family": "mlp"}],
                       "cluster": {"nodes": 2, "gpus_per_node": 3, "preprocessors_per_node": 2}})
    command = mpiexec_command(spec, "q.yaml", ["mpiexec", "-launcher", "fork"], "/py", quiet=True)
    assert command == ["mpiexec", "-launcher", "fork", "-n", "10", "/py", "-m", "fleet", "train", "q.yaml",
                       "--run-dir", "runs/q", "--ranks-per-node", "5", "--quiet"]
    assert local_launch_flags("HYDRA build details:\n Version: 5.0") == ["-launcher", "fork"]
    assert local_launch_flags("mpiexec (Open MPI) 5.0.3") == ["--oversubscribe"]
    assert local_launch_flags("something else") == []


def test_a_multi_node_allocation_gets_a_note_that_fleet_run_stays_on_this_node():
    assert allocation_note({}) is None
    assert allocation_note({"SLURM_JOB_ID": "9", "SLURM_JOB_NUM_NODES": "1"}) is None
    assert allocation_note({"SLURM_JOB_ID": "9", "SLURM_JOB_NUM_NODES": "4"}) == (
        "fleet: slurm job 9 has 4 nodes; this command starts every rank on this one "
        "(for all of them: `fleet submit`, or `fleet train` under srun/jsrun)")
    assert allocation_note({"LSB_JOBID": "5", "LSB_MCPU_HOSTS": "login 1 a 40 b 40"}).startswith(
        "fleet: lsf job 5 has 3 nodes;")


def test_fleet_mpiexec_chooses_the_launcher_and_a_wrong_one_is_named(tmp_path):
    beside = tmp_path / "venv" / "bin"
    beside.mkdir(parents=True)
    (beside / "mpiexec").write_text("")
    python = str(beside / "python")
    assert find_mpiexec(python, {}) == str(beside / "mpiexec")
    assert find_mpiexec(python, {"FLEET_MPIEXEC": "/bin/sh"}) == "/bin/sh"
    assert find_mpiexec(python, {"FLEET_MPIEXEC": "sh"}) == shutil.which("sh")
    with pytest.raises(UserError, match=r"^FLEET_MPIEXEC: '/no/mpirun' is not an executable file or a command on PATH$"):
        find_mpiexec(python, {"FLEET_MPIEXEC": "/no/mpirun"})


def test_a_device_override_is_the_spec_s_enum():
    """`--device emulated` used to leave a plain string where the runtime reads `.value`."""
    from fleet.runtime.rank import with_device
    from fleet.spec import Device

    spec = parse_spec({"name": "x", "data": {"source": "digits"}, "models": [{"family": "mlp"}]})
    overridden = with_device(spec, "emulated")
    assert overridden.cluster.device is Device.EMULATED and overridden.cluster.device.value == "emulated"
