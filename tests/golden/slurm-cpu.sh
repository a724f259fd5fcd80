#!/bin/bash
# fleet ensemble quickstart as a Slurm batch job, written by `fleet submit`.
# 4 nodes x (8 trainers + 2 preprocessors) = 40 ranks, CPU only
# Submit: sbatch /home/user/fleet/runs/quickstart/sbatch.sh
# USR1 (120 s before the time limit, or `scancel --signal=USR1 --batch JOBID`) makes every
# rank checkpoint at its next step; `fleet train` then exits 75 and the job requeues itself and
# resumes in the same run directory. Exit 0: the ensemble is finished.
#SBATCH --job-name=quickstart
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=10
#SBATCH --cpus-per-task=4
#SBATCH --time=01:30:00
#SBATCH --account=abc123
#SBATCH --partition=compute
#SBATCH --output=/home/user/fleet/runs/quickstart/slurm-%j.out
#SBATCH --open-mode=append
#SBATCH --requeue
#SBATCH --signal=B:USR1@120

set -u
cd /home/user/fleet || exit 1
export PYTHONUNBUFFERED=1
# MPICH (the PyPI wheel) speaks PMI-1 to srun's pmi2 plugin: leave MPIR_CVAR_PMI_VERSION unset.
spec=/home/user/fleet/examples/quickstart.yaml
run_dir=/home/user/fleet/runs/quickstart

echo "fleet: job ${SLURM_JOB_ID} (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST} at $(date '+%F %T')"
srun --mpi=pmi2 /home/user/fleet/.venv/bin/python -m fleet train "$spec" --run-dir "$run_dir" &
pid=$!

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

case $status in
0)  echo "fleet: ensemble finished: $run_dir/results.json" ;;
75) echo "fleet: checkpointed, not finished: requeueing job ${SLURM_JOB_ID} to resume in $run_dir"
    scontrol requeue "$SLURM_JOB_ID" && exit 0
    echo "fleet: requeue failed; resume with: sbatch /home/user/fleet/runs/quickstart/sbatch.sh" ;;
*)  echo "fleet: fleet train exited with status $status" ;;
esac
exit "$status"
