"""The batch script templates. ``{{name}}`` marks a value `render.py` fills in; every other
character is the script as written (so ``${VAR}`` is the shell's).

Both scripts start `fleet train` on every rank in the background, pass the checkpoint signal
(USR1, or TERM at the walltime) on to it, wait for it, and requeue the job when it exits 75
("checkpointed, not finished"), so that the requeued job resumes in the same run directory.
"""

FORWARD_AND_WAIT = """\
caught=
# USR1 on, whichever arrived: srun (and perhaps jsrun) ends the step at once on TERM.
forward() { caught=$1; echo "fleet: SIG$1: every rank checkpoints at its next step"; kill -s USR1 "$pid" 2>/dev/null; }
trap 'forward USR1' USR1
trap 'forward TERM' TERM
while :; do
    caught=
    wait "$pid"; status=$?
    [ -n "$caught" ] && [ "$status" -gt 128 ] || break  # a trapped signal ends `wait` early
done
"""
"""Both scripts: pass the checkpoint signal on to the launcher in the background ($pid) as USR1
and wait for it, again after each trapped signal (which ends `wait` early); leaves $status.

A TERM to the batch shell (`scancel --signal=TERM --batch`, a site's preemption) goes on as
USR1 too: srun takes TERM as "kill the step" (it SIGKILLs the tasks, "forcing job
termination"), which would leave no time to checkpoint; USR1 it passes on to every task."""

SLURM = """\
#!/bin/bash
# fleet ensemble {{name}} as a Slurm batch job, written by `fleet submit`.
# {{layout}}
# Submit: sbatch {{script}}
# USR1 ({{warning_s}} s before the time limit, or `scancel --signal=USR1 --batch JOBID`) makes every
# rank checkpoint at its next step; `fleet train` then exits 75 and the job requeues itself and
# resumes in the same run directory. Exit 0: the ensemble is finished.
#SBATCH --job-name={{name}}
#SBATCH --nodes={{nodes}}
#SBATCH --ntasks-per-node={{tasks_per_node}}
#SBATCH --cpus-per-task={{cpus_per_task}}
{{resources}}#SBATCH --output={{run_dir}}/slurm-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@{{warning_s}}

set -u
cd {{workdir_q}} || exit 1
{{env}}export PYTHONUNBUFFERED=1
# MPICH (the PyPI wheel) speaks PMI-1 to srun's pmi2 plugin: leave MPIR_CVAR_PMI_VERSION unset.
spec={{spec_q}}
run_dir={{run_dir_q}}

echo "fleet: job ${SLURM_JOB_ID} (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST} at $(date '+%F %T')"
srun --mpi=pmi2 {{launcher_args}}{{fleet}} train "$spec" --run-dir "$run_dir"{{train_args}} &
pid=$!

{{forward_and_wait}}
case $status in
0)  echo "fleet: ensemble finished: $run_dir/results.json" ;;
{{exit_checkpointed}}) echo "fleet: checkpointed, not finished: requeueing job ${SLURM_JOB_ID} to resume in $run_dir"
    scontrol requeue "$SLURM_JOB_ID" && exit 0
    echo "fleet: requeue failed; resume with: sbatch {{script}}" ;;
*)  echo "fleet: fleet train exited with status $status" ;;
esac
exit "$status"
"""

LSF = """\
#!/bin/bash
# fleet ensemble {{name}} as an LSF job started with jsrun, written by `fleet submit`.
# {{layout}}
# Every rank is a jsrun resource set of its own ({{cores}}), listed in an explicit resource
# file (ERF) that the script writes to $run_dir/jsrun.erf below.
# On each node {{preprocessors}} and the others are trainers;
# {{gpus}}
# `#BSUB -nnodes` is CSM LSF's (Summit, Sierra); other LSF sites use -n and span[ptile=N].
# Submit: bsub < {{script}}   (bsub reads the #BSUB lines from standard input)
# USR1 ({{warning_min}} min before the run limit, or `bkill -s USR1 JOBID`) makes every rank
# checkpoint at its next step; `fleet train` then exits 75 and the job requeues itself
# (brequeue, else bsub -Q) and resumes in the same run directory. Exit 0: the ensemble is finished.
#BSUB -J {{name}}
#BSUB -nnodes {{nodes}}
#BSUB -alloc_flags smt{{smt}}
{{resources}}#BSUB -o {{run_dir}}/lsf-%J.out
#BSUB -wa USR1
#BSUB -wt {{warning_min}}
#BSUB -Q "{{exit_checkpointed}}"

set -u
cd {{workdir_q}} || exit 1
{{env}}export PYTHONUNBUFFERED=1
spec={{spec_q}}
run_dir={{run_dir_q}}

echo "fleet: job ${LSB_JOBID} on ${LSB_MCPU_HOSTS:-?} at $(date '+%F %T')"
# One resource set per rank, world ranks node by node. Host 1 is the first compute node: on CSM
# LSF (Summit, Sierra) jsrun numbers the launch node 0 (see a site's numbering with
# `jsrun --erf_output FILE ...`). cpu: hardware threads at SMT{{smt}} (-alloc_flags smt{{smt}}), packed.
cat > "$run_dir/jsrun.erf" <<'ERF' || exit 1
{{erf}}ERF
jsrun --erf_input "$run_dir/jsrun.erf" {{launcher_args}}{{fleet}} train "$spec" --run-dir "$run_dir"{{train_args}} &
pid=$!

{{forward_and_wait}}
case $status in
0)  echo "fleet: ensemble finished: $run_dir/results.json" ;;
{{exit_checkpointed}}) echo "fleet: checkpointed, not finished: requeueing job ${LSB_JOBID} to resume in $run_dir"
    brequeue "$LSB_JOBID" && exit 0
    echo "fleet: brequeue failed; exiting {{exit_checkpointed}} (bsub -Q requeues the job)" ;;
*)  echo "fleet: fleet train exited with status $status" ;;
esac
exit "$status"
"""
