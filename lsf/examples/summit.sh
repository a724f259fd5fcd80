#!/bin/bash
## Example: Summit (OLCF): LSF with jsrun, 6 V100 GPUs and 42 usable cores per node.
## Made with examples/fleet100.yaml and its cluster section set to
##   cluster: {nodes: 10, gpus_per_node: 6, preprocessors_per_node: auto, device: cuda}
## and: fleet submit examples/fleet100.yaml --scheduler lsf --dry-run --time 2:00:00 \
##        --account ABC123 --queue batch --preprocessors 1 --cpus-per-task 6 \
##        --env module:open-ce --env conda:fleet --launcher-args '--smpiargs="-disable_gpu_hooks"'
## 7 ranks x 6 cores = 42 cores per node. -disable_gpu_hooks: Spectrum MPI's CUDA hooks need a
## CUDA-linked executable, and fleet sends only host buffers through MPI.
# fleet ensemble fleet100 as an LSF job started with jsrun, written by `fleet submit`.
# 10 nodes x (6 trainers + 1 preprocessor) = 70 ranks, 6 GPUs per node
# One jsrun resource set per node holds the node's ranks, cores and GPUs; on each node
# the first rank is the preprocessor and the others are trainers (trainer i uses GPU i).
# `#BSUB -nnodes` is CSM LSF's (Summit, Sierra); other LSF sites use -n and span[ptile=N].
# Submit: bsub < /home/user/fleet/runs/fleet100/bsub.sh   (bsub reads the #BSUB lines from standard input)
# USR1 (2 min before the run limit, or `bkill -s USR1 JOBID`) makes every rank
# checkpoint at its next step; `fleet train` then exits 75 and the job requeues itself
# (brequeue, else bsub -Q) and resumes in the same run directory. Exit 0: the ensemble is finished.
#BSUB -J fleet100
#BSUB -nnodes 10
#BSUB -W 02:00
#BSUB -P ABC123
#BSUB -q batch
#BSUB -o /home/user/fleet/runs/fleet100/lsf-%J.out
#BSUB -wa USR1
#BSUB -wt 2
#BSUB -Q "75"

set -u
cd /home/user/fleet || exit 1
module load open-ce
eval "$(conda shell.bash hook)"
conda activate fleet
export PYTHONUNBUFFERED=1
spec=/home/user/fleet/examples/fleet100.yaml
run_dir=/home/user/fleet/runs/fleet100

echo "fleet: job ${LSB_JOBID} on ${LSB_MCPU_HOSTS:-?} at $(date '+%F %T')"
jsrun -n 10 -r 1 -a 7 -c 42 -g 6 --bind packed:6 -d packed --smpiargs="-disable_gpu_hooks" fleet train "$spec" --run-dir "$run_dir" &
pid=$!

caught=
forward() { caught=$1; echo "fleet: SIG$1: every rank checkpoints at its next step"; kill -s "$1" "$pid" 2>/dev/null; }
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
