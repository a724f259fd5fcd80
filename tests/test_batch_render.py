"""Batch jobs and scripts: the pure parts (spec + options -> BatchJob -> text) and golden files.

A golden mismatch after a deliberate template change: run
``.venv/bin/python tests/golden/regenerate.py`` and review ``git diff tests/golden``.
"""

import difflib
import json
import re
import subprocess

import pytest
import yaml

from golden.cases import CASES, CWD, GOLDEN, PYTHON, REPO, render_case, without_commentary
from fleet.batch import BatchSystem, EnvKind, EnvStep, SubmitOptions, batch_job, parse_env, parse_walltime, render
from fleet.batch.render import SMT, fill, lsf_time, render_erf, slurm_time
from fleet.batch.submit import parse_job_id
from fleet.errors import UserError
from fleet.spec import parse_spec

REGENERATE = ".venv/bin/python tests/golden/regenerate.py"


def spec_of(cluster: dict, name: str = "tiny", **top):
    doc = {"name": name, "data": {"source": "digits"}, "models": [{"family": "mlp"}], "cluster": cluster, **top}
    return parse_spec(doc)


def job_of(cluster: dict, system: str = "slurm", **options):
    return batch_job(spec_of(cluster), "s.yaml", SubmitOptions(BatchSystem(system), **options), CWD, PYTHON)


# --- golden files ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_rendered_script_matches_golden_file(case):
    expected = (GOLDEN / case.name).read_text()
    got = render_case(case)
    diff = "".join(difflib.unified_diff(expected.splitlines(True), got.splitlines(True), "golden", "rendered"))
    assert got == expected, f"{case.name} differs from its golden file (regenerate: {REGENERATE}):\n{diff}"


@pytest.mark.parametrize("case", [c for c in CASES if c.example], ids=[c.example for c in CASES if c.example])
def test_commented_example_is_the_rendered_script(case):
    example = (REPO / case.example).read_text()
    assert example.splitlines()[1].startswith("## "), "an example starts with its ## notes"
    assert without_commentary(example) == render_case(case), f"regenerate: {REGENERATE}"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_golden_script_is_valid_bash(case):
    done = subprocess.run(["bash", "-n", str(GOLDEN / case.name)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# --- the job's shape ------------------------------------------------------------------------


def test_tasks_per_node_are_trainers_plus_preprocessors():
    job = job_of({"nodes": 3, "gpus_per_node": 4, "preprocessors_per_node": 2, "device": "cuda"})
    assert (job.nodes, job.tasks_per_node, job.tasks, job.gpus_per_node) == (3, 6, 18, 4)
    text = render(job)
    assert "#SBATCH --nodes=3\n#SBATCH --ntasks-per-node=6\n" in text
    assert "#SBATCH --gpus-per-node=4\n" in text


def test_cpu_and_emulated_runs_request_no_gpus():
    for device in ("cpu", "emulated"):
        job = job_of({"gpus_per_node": 4, "device": device})
        assert job.gpus_per_node == 0 and "--gpus-per-node" not in render(job)


def test_auto_preprocessors_take_the_option_or_one():
    assert job_of({"gpus_per_node": 2, "preprocessors_per_node": "auto"}).preprocessors_per_node == 1
    assert job_of({"gpus_per_node": 2, "preprocessors_per_node": "auto"}, preprocessors=3).preprocessors_per_node == 3
    assert job_of({"gpus_per_node": 2, "preprocessors_per_node": 2}, preprocessors=2).preprocessors_per_node == 2


def test_preprocessors_option_cannot_contradict_the_spec():
    with pytest.raises(UserError, match=r"^--preprocessors 3: the spec fixes cluster.preprocessors_per_node: 2"):
        job_of({"gpus_per_node": 2, "preprocessors_per_node": 2}, preprocessors=3)


def test_cores_per_task_default_to_threads_per_trainer():
    assert job_of({"threads_per_trainer": 4}).cpus_per_task == 4
    assert job_of({"threads_per_trainer": 4}, cpus_per_task=7).cpus_per_task == 7


def test_paths_are_absolute_against_the_submit_directory():
    job = batch_job(spec_of({}, run_dir="out/r1"), "specs/s.yaml", SubmitOptions(BatchSystem.SLURM), CWD, PYTHON)
    assert (job.spec_path, job.run_dir, job.workdir) == (f"{CWD}/specs/s.yaml", f"{CWD}/out/r1", CWD)
    assert f"cd {CWD} || exit 1" in render(job)


def test_fleet_runs_with_this_python_unless_an_environment_is_given():
    assert job_of({}).fleet == (PYTHON, "-m", "fleet")
    assert job_of({}, env=("conda:fl",)).fleet == ("fleet",)


def test_environment_steps_render_in_order():
    text = render(job_of({}, env=("module:cuda/12,openmpi", "conda:fleet", "venv:envs/v")))
    lines = text.splitlines()
    start = lines.index("module load cuda/12 openmpi")
    assert lines[start:start + 4] == [
        "module load cuda/12 openmpi", 'eval "$(conda shell.bash hook)"', "conda activate fleet",
        f"source {CWD}/envs/v/bin/activate",
    ]


@pytest.mark.parametrize("system", ["slurm", "lsf"])
def test_a_job_can_predict_with_an_earlier_runs_measures(system):
    plain = render(job_of({}, system))
    assert "--calibrate-from" not in plain
    text = render(job_of({}, system, calibrate_from="runs/pilot it"))
    line = next(line for line in text.splitlines() if ' train "$spec" --run-dir "$run_dir"' in line)
    assert line.endswith(f" --calibrate-from '{CWD}/runs/pilot it' &")


def test_paths_with_shell_characters_are_quoted():
    odd = "/home/o'brien/fleet"
    job = batch_job(spec_of({}, run_dir="/scratch/run1"), "s.yaml", SubmitOptions(BatchSystem.SLURM), odd, PYTHON)
    assert "spec='/home/o'\"'\"'brien/fleet/s.yaml'" in render(job)


def test_run_dir_with_spaces_is_refused():
    job = batch_job(spec_of({}, run_dir="/scratch/my run"), "s.yaml", SubmitOptions(BatchSystem.SLURM), CWD, PYTHON)
    with pytest.raises(UserError, match=r"^--run-dir '/scratch/my run': #SBATCH/#BSUB lines cannot hold"):
        render(job)


@pytest.mark.parametrize("option, value", [("account", "a b"), ("partition", "gpu;rm")])
def test_directive_values_must_be_one_plain_word(option, value):
    with pytest.raises(UserError, match=rf"^--{option} "):
        job_of({}, **{option: value})


def test_the_queue_option_is_named_for_lsf():
    with pytest.raises(UserError, match=r"^--queue "):
        job_of({}, "lsf", partition="a b")


# --- options ------------------------------------------------------------------------------


@pytest.mark.parametrize("text, seconds", [
    ("90", 5400), ("30:15", 1815), ("2:00:00", 7200), ("1-12", 129600), ("1-02:03", 93780), ("1-02:03:04", 93784),
])
def test_walltime_takes_slurms_forms(text, seconds):
    assert parse_walltime(text) == seconds


@pytest.mark.parametrize("text", ["2h", "", "1:2:3:4", "-5", "1.5"])
def test_walltime_rejects_other_forms(text):
    with pytest.raises(UserError, match=r"^--time .*expected minutes, HH:MM:SS or D-HH:MM:SS"):
        parse_walltime(text)


def test_walltime_must_leave_room_for_the_checkpoint_warning():
    with pytest.raises(UserError, match=r"^--time '2': must be longer than the 120 s checkpoint warning"):
        parse_walltime("2")


def test_walltime_formats():
    assert (slurm_time(7200), slurm_time(90061), lsf_time(7200), lsf_time(90)) == ("02:00:00", "1-01:01:01", "02:00", "00:02")


def test_env_steps():
    assert parse_env("conda:fleet", CWD) == EnvStep(EnvKind.CONDA, "fleet")
    assert parse_env("venv:.venv", CWD) == EnvStep(EnvKind.VENV, f"{CWD}/.venv")
    assert parse_env("module:cuda/12.4,openmpi", CWD) == EnvStep(EnvKind.MODULE, "cuda/12.4,openmpi")


@pytest.mark.parametrize("text", ["pip:x", "conda:", "conda", "module:a b"])
def test_bad_env_steps_name_the_option(text):
    with pytest.raises(UserError, match=r"^--env "):
        parse_env(text, CWD)


# --- text pieces --------------------------------------------------------------------------


def test_slurm_script_asks_for_the_checkpoint_signal_and_requeues():
    text = render(job_of({"gpus_per_node": 2}, time="1:00:00"))
    for line in ("#SBATCH --signal=B:USR1@120", "#SBATCH --requeue", "#SBATCH --open-mode=append",
                 "#SBATCH --time=01:00:00", 'scontrol requeue "$SLURM_JOB_ID" && exit 0'):
        assert line in text
    assert f'srun --mpi=pmi2 {PYTHON} -m fleet train "$spec" --run-dir "$run_dir" &' in text


def test_lsf_script_asks_for_the_warning_action_and_requeues():
    text = render(job_of({"gpus_per_node": 2}, "lsf", time="1:00:00"))
    for line in ("#BSUB -wa USR1", "#BSUB -wt 2", '#BSUB -Q "75"', "#BSUB -W 01:00", 'brequeue "$LSB_JOBID" && exit 0'):
        assert line in text


ERF_RANK = re.compile(r"rank: (\d+): \{ host: (\d+); cpu: \{(\d+)-(\d+)\}(?: ; gpu: \{(\d+)\})? \}")


def erf_ranks(text: str) -> dict[int, tuple[int, range, int | None]]:
    """rank -> (host, hardware threads, GPU or None) of every ``rank:`` line of an ERF."""
    ranks = {}
    for line in text.splitlines():
        if line.startswith("rank:"):
            rank, host, low, high, gpu = ERF_RANK.fullmatch(line).groups()
            assert int(rank) not in ranks, f"rank {rank} twice"
            ranks[int(rank)] = (int(host), range(int(low), int(high) + 1), None if gpu is None else int(gpu))
    return ranks


def test_erf_gives_each_rank_its_own_resource_set():
    job = job_of({"nodes": 2, "gpus_per_node": 4, "preprocessors_per_node": 1, "device": "cuda"}, "lsf",
                 cpus_per_task=3)
    text = render_erf(job)
    assert text.splitlines()[:2] == ["cpu_index_using: logical", "launch_distribution: packed"]
    ranks = erf_ranks(text)
    assert sorted(ranks) == list(range(10))
    assert [ranks[r][0] for r in range(10)] == [1] * 5 + [2] * 5  # host 0 is the launch node
    for host in (1, 2):
        local = [ranks[r] for r in range(10) if ranks[r][0] == host]
        assert [gpu for _, _, gpu in local] == [None, 0, 1, 2, 3]  # the preprocessor first, then trainers 0..3
        threads = [t for _, cpus, _ in local for t in cpus]
        assert all(len(cpus) == 3 * SMT for _, cpus, _ in local)
        assert threads == list(range(5 * 3 * SMT))  # disjoint and packed in node-local order


def test_erf_of_a_cpu_job_has_no_gpus():
    job = job_of({"nodes": 2, "gpus_per_node": 2, "preprocessors_per_node": 2, "device": "cpu"}, "lsf")
    text = render_erf(job)
    assert "gpu" not in text
    assert sorted(erf_ranks(text)) == list(range(8))


def test_lsf_script_writes_the_erf_and_starts_jsrun_on_it():
    job = job_of({"gpus_per_node": 2, "device": "cuda"}, "lsf")
    text = render(job)
    assert "#BSUB -alloc_flags smt4\n" in text
    assert f"cat > \"$run_dir/jsrun.erf\" <<'ERF' || exit 1\n{render_erf(job)}ERF\n" in text
    assert f'jsrun --erf_input "$run_dir/jsrun.erf" {PYTHON} -m fleet train "$spec" --run-dir "$run_dir" &' in text


def test_launcher_args_go_before_the_program():
    text = render(job_of({}, launcher_args="--cpu-bind=cores"))
    assert f"srun --mpi=pmi2 --cpu-bind=cores {PYTHON} -m fleet train" in text


def test_fill_refuses_a_placeholder_without_a_value():
    assert fill("a {{x}} b", {"x": "1"}) == "a 1 b"
    with pytest.raises(KeyError):
        fill("{{y}}", {})


@pytest.mark.parametrize("system, stdout, job_id", [
    ("slurm", "1234\n", "1234"), ("slurm", "1234;cluster2\n", "1234"),
    ("lsf", "Job <5678> is submitted to queue <batch>.\n", "5678"),
])
def test_job_ids_from_the_submitters(system, stdout, job_id):
    assert parse_job_id(BatchSystem(system), stdout) == job_id


def test_no_job_id_is_a_user_error():
    with pytest.raises(UserError, match=r"^sbatch printed no job id"):
        parse_job_id(BatchSystem.SLURM, "sbatch: error: bad\n")


# --- the command ----------------------------------------------------------------------------


@pytest.fixture
def tiny_spec(tmp_path):
    path = tmp_path / "s.yaml"
    doc = {"name": "tiny", "data": {"source": "digits"}, "models": [{"family": "mlp"}],
           "cluster": {"gpus_per_node": 2, "preprocessors_per_node": 1, "device": "cpu"}}
    path.write_text(yaml.safe_dump(doc))
    return path


def test_submit_dry_run_writes_the_script_into_the_run_dir(fleet_cli, tiny_spec, tmp_path):
    done = fleet_cli("submit", str(tiny_spec), "--scheduler", "slurm", "--dry-run", "--run-dir", str(tmp_path / "r"),
                     "--time", "30")
    assert done.returncode == 0, done.stderr
    script = tmp_path / "r" / "sbatch.sh"
    assert f"wrote {script}" in done.stdout and "sbatch" in done.stdout
    assert script.stat().st_mode & 0o100
    assert "#SBATCH --ntasks-per-node=3\n" in script.read_text()


def test_submit_without_the_submitter_says_so_in_one_line(fleet_cli, tiny_spec, tmp_path):
    for system, command in (("slurm", "sbatch"), ("lsf", "bsub")):
        done = fleet_cli("submit", str(tiny_spec), "--scheduler", system, "--run-dir", str(tmp_path / "r"),
                         env={"PATH": str(tmp_path / "nothing")})
        assert done.returncode == 2
        assert done.stderr.count("\n") == 1 and f"{command} not found" in done.stderr and "--dry-run" in done.stderr
    assert not (tmp_path / "r").exists()


def test_submit_refuses_virtual_nodes_and_a_run_dir_of_another_ensemble(fleet_cli, tmp_path):
    doc = {"name": "v", "data": {"source": "digits"}, "models": [{"family": "mlp"}],
           "cluster": {"nodes": 2, "gpus_per_node": 1, "virtual_nodes": True}}
    (tmp_path / "v.yaml").write_text(yaml.safe_dump(doc))
    done = fleet_cli("submit", str(tmp_path / "v.yaml"), "--scheduler", "slurm", "--dry-run", "--run-dir", str(tmp_path / "r"))
    assert done.returncode == 2 and "cluster.virtual_nodes" in done.stderr and done.stderr.count("\n") == 1
    doc["cluster"] = {"nodes": 1, "gpus_per_node": 1}
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(doc))
    done = fleet_cli("submit", str(tmp_path / "a.yaml"), "--scheduler", "slurm", "--dry-run", "--run-dir", str(tmp_path / "r"))
    assert done.returncode == 0, done.stderr
    (tmp_path / "r" / "spec.yaml").write_text(yaml.safe_dump({**doc, "models": [{"family": "cnn"}], "run_dir": "x"}))
    done = fleet_cli("submit", str(tmp_path / "a.yaml"), "--scheduler", "slurm", "--dry-run", "--run-dir", str(tmp_path / "r"))
    assert done.returncode == 2 and "different ensemble" in done.stderr, done.stderr


@pytest.mark.parametrize("args, message", [
    (["--time", "2h"], "fleet submit: error: --time '2h': expected"),
    (["--env", "pip:x"], "fleet submit: error: --env 'pip:x': expected"),
    (["--scheduler", "pbs"], "fleet submit: error: argument --scheduler: unknown 'pbs'"),
    (["--preprocessors", "0"], "fleet submit: error: argument --preprocessors: expected a positive integer"),
    (["--calibrate-from", "/nonexistent/run"], "fleet submit: error: --calibrate-from /nonexistent/run: no results.json"),
])
def test_submit_bad_options_exit_2_naming_the_option(fleet_cli, tiny_spec, tmp_path, args, message):
    base = ["submit", str(tiny_spec), "--dry-run", "--run-dir", str(tmp_path / "r")]
    if "--scheduler" not in args:
        base += ["--scheduler", "slurm"]
    done = fleet_cli(*base, *args)
    assert done.returncode == 2 and done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr


def fake_submitter(bin_dir, name: str, stdout: str):
    """A stand-in for sbatch or bsub that records its arguments and standard input."""
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / name
    tool.write_text(f'#!/bin/sh\necho "$*" > "{bin_dir}/{name}.args"\ncat > "{bin_dir}/{name}.stdin"\n'
                    f"echo '{stdout}'\n")
    tool.chmod(0o755)


@pytest.mark.parametrize("system, name, stdout, job_id", [
    ("slurm", "sbatch", "4242", "4242"), ("lsf", "bsub", "Job <77> is submitted to queue <normal>.", "77"),
])
def test_submit_runs_the_submitter_and_prints_the_job_id(fleet_cli, tiny_spec, tmp_path, system, name, stdout, job_id):
    bin_dir = tmp_path / "bin"
    fake_submitter(bin_dir, name, stdout)
    done = fleet_cli("submit", str(tiny_spec), "--scheduler", system, "--run-dir", str(tmp_path / "r"),
                     env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert f"submitted {system} job {job_id}" in done.stdout
    script = tmp_path / "r" / ("sbatch.sh" if system == "slurm" else "bsub.sh")
    args, stdin = (bin_dir / f"{name}.args").read_text(), (bin_dir / f"{name}.stdin").read_text()
    if system == "slurm":
        assert args.split() == ["--parsable", str(script)]
    else:
        assert stdin == script.read_text()  # bsub reads #BSUB lines from standard input only


def test_auto_preprocessors_come_from_the_profiles_predicted_plan(fleet_cli, tmp_path):
    """Baseline runs the four models at once, one stream each at 1000 samples/s: 4000/s in
    all, which four preprocessors decode (5000/s measured) and two do not (2800/s)."""
    doc = {"name": "auto", "data": {"source": "digits"}, "models": [{"family": "mlp", "name": n} for n in "abcd"],
           "scheduler": {"policy": "baseline"},
           "cluster": {"gpus_per_node": 4, "preprocessors_per_node": "auto", "device": "cpu"}}
    spec = tmp_path / "auto.yaml"
    spec.write_text(yaml.safe_dump(doc))
    run_dir = tmp_path / "r"

    def ranks_per_node(*extra):
        done = fleet_cli("submit", str(spec), "--scheduler", "slurm", "--dry-run", "--run-dir", str(run_dir), *extra)
        assert done.returncode == 0, done.stderr
        return int(re.search(r"#SBATCH --ntasks-per-node=(\d+)", (run_dir / "sbatch.sh").read_text()).group(1)), done

    assert ranks_per_node()[0] == 4 + 1  # no profile yet: one per node
    profile = {"schema": 1, "gpus_per_node": 4, "samples_per_epoch": 1000,
               "models": [{"id": n, "rates": {"1": 1000.0}, "epochs": 2} for n in "abcd"],
               "preprocessing": {"samples_per_s": {"1": 1500.0, "2": 2800.0, "4": 5000.0}, "per_node": 1}}
    (run_dir / "profile.json").write_text(json.dumps(profile))
    count, done = ranks_per_node()
    assert count == 4 + 4 and "preprocessors_per_node auto: 4 per node" in done.stdout and "4,000 samples/s" in done.stdout
    assert ranks_per_node("--preprocessors", "2")[0] == 4 + 2  # the option wins
