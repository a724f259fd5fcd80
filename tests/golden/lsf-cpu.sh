#!/bin/bash
# fleet ensemble quickstart as an LSF job started with jsrun, written by `fleet submit`.
# 2 nodes x (4 trainers + 1 preprocessor) = 10 ranks, CPU only
# Every rank is a jsrun resource set of its own (1 core), listed in an explicit resource
# file (ERF) that the script writes to $run_dir/jsrun.erf below.
# On each node the first rank is the preprocessor and the others are trainers;
# no rank gets a GPU (CPU only).
# `#BSUB -nnodes` is CSM LSF's (Summit, Sierra); other LSF sites use -n and span[ptile=N].
# Submit: bsub < /home/user/fleet/runs/quickstart/bsub.sh   (bsub reads the #BSUB lines from standard input)
# USR1 (2 min before the run limit, or `bkill -s USR1 JOBID`) makes every rank
# checkpoint at its next step; `fleet train` then exits 75 and the job requeues itself
# (brequeue, else bsub -Q) and resumes in the same run directory. Exit 0: the ensemble is finished.
#BSUB -J quickstart
#BSUB -nnodes 2
#BSUB -alloc_flags smt4
#BSUB -o /home/user/fleet/runs/quickstart/lsf-%J.out
#BSUB -wa USR1
#BSUB -wt 2
#BSUB -Q "75"

set -u
cd /home/user/fleet || exit 1
export PYTHONUNBUFFERED=1
spec=/home/user/fleet/examples/quickstart.yaml
run_dir=/home/user/fleet/runs/quickstart

echo "fleet: job ${LSB_JOBID} on ${LSB_MCPU_HOSTS:-?} at $(date '+%F %T')"
# One resource set per rank, world ranks node by node. Host 1 is the first compute node: on CSM
# LSF (Summit, Sierra) jsrun numbers the launch node 0 (see a site's numbering with
# `jsrun --erf_output FILE ...`). cpu: hardware threads at SMT4 (-alloc_flags smt4), packed.
cat > "$run_dir/jsrun.erf" <<'ERF' || exit 1
cpu_index_using: logical
launch_distribution: packed
rank: 0: { host: 1; cpu: {0-3} }
rank: 1: { host: 1; cpu: {4-7} }
rank: 2: { host: 1; cpu: {8-11} }
rank: 3: { host: 1; cpu: {12-15} }
rank: 4: { host: 1; cpu: {16-19} }
rank: 5: { host: 2; cpu: {0-3} }
rank: 6: { host: 2; cpu: {4-7} }
rank: 7: { host: 2; cpu: {8-11} }
rank: 8: { host: 2; cpu: {12-15} }
rank: 9: { host: 2; cpu: {16-19} }
ERF
jsrun --erf_input "$run_dir/jsrun.erf" /home/user/fleet/.venv/bin/python -m fleet train "$spec" --run-dir "$run_dir" &
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
75) echo "fleet: checkpointed, not finished: requeueing job ${LSB_JOBID} to resume in $run_dir"
    brequeue "$LSB_JOBID" && exit 0
    echo "fleet: brequeue failed; exiting 75 (bsub -Q requeues the job)" ;;
*)  echo "fleet: fleet train exited with status $status" ;;
esac
exit "$status"
