#!/bin/bash
## Example: Summit (OLCF): LSF with jsrun, 6 V100 GPUs and 42 usable cores per node.
## Made with examples/fleet100.yaml and its cluster section set to
##   cluster: {nodes: 10, gpus_per_node: 6, preprocessors_per_node: auto, device: cuda}
## and: fleet submit examples/fleet100.yaml --scheduler lsf --dry-run --time 2:00:00 \
##        --account ABC123 --queue batch --preprocessors 1 --cpus-per-task 6 \
##        --env module:open-ce --env conda:fleet --launcher-args '--smpiargs="-disable_gpu_hooks"'
## 7 ranks x 6 cores = 42 cores per node = hardware threads 0-167 at SMT4. -disable_gpu_hooks:
## Spectrum MPI's CUDA hooks need a CUDA-linked executable, and fleet sends only host buffers through MPI.
## NUMA: socket 0 holds cores 0-20 (threads 0-83) and GPUs 0-2, socket 1 the rest. Packed, the
## 4th rank of a node (trainer 2, GPU 2) gets cores 18-23, across both sockets; to keep every
## trainer on its GPU's socket, swap the cpu sets of each node's 1st and 4th ranks in the ERF
## (the preprocessor takes {72-95}, trainer 2 {0-23}); see lsf/README.md.
# fleet ensemble fleet100 as an LSF job started with jsrun, written by `fleet submit`.
# 10 nodes x (6 trainers + 1 preprocessor) = 70 ranks, 6 GPUs per node
# Every rank is a jsrun resource set of its own (6 cores), listed in an explicit resource
# file (ERF) that the script writes to $run_dir/jsrun.erf below.
# On each node the first rank is the preprocessor and the others are trainers;
# trainer i gets GPU i only (its cuda:0), a preprocessor none.
# `#BSUB -nnodes` is CSM LSF's (Summit, Sierra); other LSF sites use -n and span[ptile=N].
# Submit: bsub < /home/user/fleet/runs/fleet100/bsub.sh   (bsub reads the #BSUB lines from standard input)
# USR1 (2 min before the run limit, or `bkill -s USR1 JOBID`) makes every rank
# checkpoint at its next step; `fleet train` then exits 75 and the job requeues itself
# (brequeue, else bsub -Q) and resumes in the same run directory. Exit 0: the ensemble is finished.
#BSUB -J fleet100
#BSUB -nnodes 10
#BSUB -alloc_flags smt4
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
# One resource set per rank, world ranks node by node. Host 1 is the first compute node: on CSM
# LSF (Summit, Sierra) jsrun numbers the launch node 0 (see a site's numbering with
# `jsrun --erf_output FILE ...`). cpu: hardware threads at SMT4 (-alloc_flags smt4), packed.
cat > "$run_dir/jsrun.erf" <<'ERF' || exit 1
cpu_index_using: logical
launch_distribution: packed
rank: 0: { host: 1; cpu: {0-23} }
rank: 1: { host: 1; cpu: {24-47} ; gpu: {0} }
rank: 2: { host: 1; cpu: {48-71} ; gpu: {1} }
rank: 3: { host: 1; cpu: {72-95} ; gpu: {2} }
rank: 4: { host: 1; cpu: {96-119} ; gpu: {3} }
rank: 5: { host: 1; cpu: {120-143} ; gpu: {4} }
rank: 6: { host: 1; cpu: {144-167} ; gpu: {5} }
rank: 7: { host: 2; cpu: {0-23} }
rank: 8: { host: 2; cpu: {24-47} ; gpu: {0} }
rank: 9: { host: 2; cpu: {48-71} ; gpu: {1} }
rank: 10: { host: 2; cpu: {72-95} ; gpu: {2} }
rank: 11: { host: 2; cpu: {96-119} ; gpu: {3} }
rank: 12: { host: 2; cpu: {120-143} ; gpu: {4} }
rank: 13: { host: 2; cpu: {144-167} ; gpu: {5} }
rank: 14: { host: 3; cpu: {0-23} }
rank: 15: { host: 3; cpu: {24-47} ; gpu: {0} }
rank: 16: { host: 3; cpu: {48-71} ; gpu: {1} }
rank: 17: { host: 3; cpu: {72-95} ; gpu: {2} }
rank: 18: { host: 3; cpu: {96-119} ; gpu: {3} }
rank: 19: { host: 3; cpu: {120-143} ; gpu: {4} }
rank: 20: { host: 3; cpu: {144-167} ; gpu: {5} }
rank: 21: { host: 4; cpu: {0-23} }
rank: 22: { host: 4; cpu: {24-47} ; gpu: {0} }
rank: 23: { host: 4; cpu: {48-71} ; gpu: {1} }
rank: 24: { host: 4; cpu: {72-95} ; gpu: {2} }
rank: 25: { host: 4; cpu: {96-119} ; gpu: {3} }
rank: 26: { host: 4; cpu: {120-143} ; gpu: {4} }
rank: 27: { host: 4; cpu: {144-167} ; gpu: {5} }
rank: 28: { host: 5; cpu: {0-23} }
rank: 29: { host: 5; cpu: {24-47} ; gpu: {0} }
rank: 30: { host: 5; cpu: {48-71} ; gpu: {1} }
rank: 31: { host: 5; cpu: {72-95} ; gpu: {2} }
rank: 32: { host: 5; cpu: {96-119} ; gpu: {3} }
rank: 33: { host: 5; cpu: {120-143} ; gpu: {4} }
rank: 34: { host: 5; cpu: {144-167} ; gpu: {5} }
rank: 35: { host: 6; cpu: {0-23} }
rank: 36: { host: 6; cpu: {24-47} ; gpu: {0} }
rank: 37: { host: 6; cpu: {48-71} ; gpu: {1} }
rank: 38: { host: 6; cpu: {72-95} ; gpu: {2} }
rank: 39: { host: 6; cpu: {96-119} ; gpu: {3} }
rank: 40: { host: 6; cpu: {120-143} ; gpu: {4} }
rank: 41: { host: 6; cpu: {144-167} ; gpu: {5} }
rank: 42: { host: 7; cpu: {0-23} }
rank: 43: { host: 7; cpu: {24-47} ; gpu: {0} }
rank: 44: { host: 7; cpu: {48-71} ; gpu: {1} }
rank: 45: { host: 7; cpu: {72-95} ; gpu: {2} }
rank: 46: { host: 7; cpu: {96-119} ; gpu: {3} }
rank: 47: { host: 7; cpu: {120-143} ; gpu: {4} }
rank: 48: { host: 7; cpu: {144-167} ; gpu: {5} }
rank: 49: { host: 8; cpu: {0-23} }
rank: 50: { host: 8; cpu: {24-47} ; gpu: {0} }
rank: 51: { host: 8; cpu: {48-71} ; gpu: {1} }
rank: 52: { host: 8; cpu: {72-95} ; gpu: {2} }
rank: 53: { host: 8; cpu: {96-119} ; gpu: {3} }
rank: 54: { host: 8; cpu: {120-143} ; gpu: {4} }
rank: 55: { host: 8; cpu: {144-167} ; gpu: {5} }
rank: 56: { host: 9; cpu: {0-23} }
rank: 57: { host: 9; cpu: {24-47} ; gpu: {0} }
rank: 58: { host: 9; cpu: {48-71} ; gpu: {1} }
rank: 59: { host: 9; cpu: {72-95} ; gpu: {2} }
rank: 60: { host: 9; cpu: {96-119} ; gpu: {3} }
rank: 61: { host: 9; cpu: {120-143} ; gpu: {4} }
rank: 62: { host: 9; cpu: {144-167} ; gpu: {5} }
rank: 63: { host: 10; cpu: {0-23} }
rank: 64: { host: 10; cpu: {24-47} ; gpu: {0} }
rank: 65: { host: 10; cpu: {48-71} ; gpu: {1} }
rank: 66: { host: 10; cpu: {72-95} ; gpu: {2} }
rank: 67: { host: 10; cpu: {96-119} ; gpu: {3} }
rank: 68: { host: 10; cpu: {120-143} ; gpu: {4} }
rank: 69: { host: 10; cpu: {144-167} ; gpu: {5} }
ERF
jsrun --erf_input "$run_dir/jsrun.erf" --smpiargs="-disable_gpu_hooks" fleet train "$spec" --run-dir "$run_dir" &
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
