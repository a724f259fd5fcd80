#!/usr/bin/env bash
# The CUDA path and the GPU figures of bench/RESULTS.md, on a machine with one NVIDIA GPU and
# the packages of this workplace's GPU image (torch, mpi4py on Open MPI, h5py, ...); wheels of
# what it lacks (pydantic) may lie in .whl/. Run from the repository root:
#   bash bench/gpu_check.sh [OUT_DIR [STEP...]]   (steps 1-5 by default; step 4 uses step 2's spec)
# Step 7 (by number only) builds Horovod with NCCL (the sdist and, where the image lacks Python's
# headers, a libpython3.X-dev .deb, in .gpu/), checks it on CUDA and runs its CPU tests and
# bench/collectives.py on this host's cores. Step 6 (asked for by number only) is the 32-model sweep; it keeps its work in runs/e2e-sweep
# and goes on from there when run again, so it can finish over several 10-minute commands. Step 8 (by
# number, after step 2) runs the quickstart under policy baseline: each trainer decodes its own stream.
# Step 9 (by number only) runs examples/asha.yaml on the GPU (36 configurations, 1 trainer + 3
# preprocessors) with early_stop none, asha and sha: wall, model-epochs, best and top-5 accuracy.
# Step 10 (by number only; it runs before the others asked for with it) checks the fused engine on
# CUDA and runs bench/fused.py there (8 lr variants of a small CNN and ResNet, batch 64 and 256).
set -uo pipefail
out=${1:-${OUT:-/tmp/fleet-gpu}}
steps=" ${*:2} "
[ "$steps" = "  " ] && steps=" 1 2 3 4 5 "
want() { [[ "$steps" == *" $1 "* ]]; }
mkdir -p "$out"
export PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
nvidia-smi -L; nproc
python3 - <<'PY'
import torch, mpi4py
from mpi4py import MPI
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0))
print("mpi4py", mpi4py.__version__, MPI.Get_library_version().splitlines()[0].strip("\x00"))
PY

if want 10; then
echo "== 10. fused bundles (issue 49): the fused engine's tests (its CUDA parity among them), then bench/fused.py on CUDA"
python3 -m pytest -q -p no:cacheprovider tests/test_fused_engine.py 2>&1 | tail -3
python3 bench/fused.py --device cuda --json "$out/fused-cuda.json" 2>&1 | tail -16
python3 bench/fused.py --device cuda --batch 256 2>&1 | tail -14
fi

if want 1; then
echo "== 1. engine and collective tests on CUDA"
python3 -m pytest -q -p no:cacheprovider tests/test_engine.py tests/test_models.py 2>&1 | tail -3
fi

if want 2; then
echo "== 2. quickstart on the GPU: fleet run, 1 trainer (the GPU) + 3 preprocessors"
python3 -m fleet data make synthetic --format jpeg --out "$out/qs-data" --force --quiet \
    --classes 10 --samples 2400 --image-size 20 --channels 3 --seed 0
python3 - "$out" <<'PY'
import sys, yaml
out = sys.argv[1]
spec = yaml.safe_load(open("examples/quickstart.yaml"))
spec["data"]["path"] = f"{out}/qs-data"
spec["cluster"] = {"nodes": 1, "gpus_per_node": 1, "preprocessors_per_node": 3, "device": "cuda"}
spec["train"]["batch_size"] = 128
yaml.safe_dump(spec, open(f"{out}/quickstart-gpu.yaml", "w"))
PY
python3 -m fleet profile "$out/quickstart-gpu.yaml" --run-dir "$out/qs-dry" --gpus 1,2,4,8 --quiet 2>&1 | tail -22
start=$(date +%s.%N)
python3 -m fleet run "$out/quickstart-gpu.yaml" --run-dir "$out/qs-run" 2>&1 | tail -12
end=$(date +%s.%N)
python3 - "$out" "$start" "$end" <<'PY'
import json, sys
import os
r = json.load(open(f"{sys.argv[1]}/qs-run/results.json"))
profile = f"{sys.argv[1]}/qs-run/profile.json"
profiling = json.load(open(profile))["profiler"]["seconds"] if os.path.exists(profile) else 0.0
wall = float(sys.argv[3]) - float(sys.argv[2])
print(f"fleet run wall {wall:.1f} s: policy {r['policy']}, profiling {profiling:.1f} s "
      f"({100 * profiling / wall:.1f}% of the run), training makespan {r['makespan_s']:.1f} s, overhead {r['overhead_s']}")
print(f"makespan {r['makespan_s']:.1f} s, rounds {r['rounds']}, decoded {r['samples_decoded']}")
p = r.get("prediction") or {}
if p:
    print(f"forecast {p['makespan_s']:.1f} s by {p['policy']} (10-90 %: {p['range_s'][0]:.1f}-{p['range_s'][1]:.1f} s; "
          f"rates {p['rates']}); measured / forecast {p.get('measured_over_predicted', float('nan')):.2f}")
for m in r["models"]:
    rate = max(h["samples_per_s"] for h in m["history"])
    print(f"  {m['id']:<14} {m['parameters']:>8} params  best acc {m['best_val_accuracy']:.3f}  {rate:>9,.0f} samples/s")
PY
fi

if want 3; then
echo "== 3. the data path on a 16-core host (no oversubscription)"
for chunk in 168 256; do python3 bench/pipeline.py --chunk "$chunk" --bytes-too 2>&1 | tail -9; done
python3 bench/pipeline.py --chunk 168 --trainers 7 --bytes-too 2>&1 | tail -9
fi

if want 4; then
echo "== 4. a model that cannot fit on the GPU: recorded as a profiling failure, the rest profiled"
python3 - "$out" <<'PY'
import sys, yaml
out = sys.argv[1]
spec = yaml.safe_load(open(f"{out}/quickstart-gpu.yaml"))
spec["models"].append({"family": "mlp", "name": "too-big", "params": {"hidden": [2**31]}})
yaml.safe_dump(spec, open(f"{out}/oom.yaml", "w"))
PY
python3 -m fleet profile "$out/oom.yaml" --run-dir "$out/oom-run" --quiet 2>&1 | grep -A2 "left out of the plan"
fi

if want 5; then
echo "== 5. end to end on 16 cores: FLEET-G against Baseline with trainer slots that do not share cores"
rm -rf "$out/e2e"
python3 bench/e2e_cpu.py --trainers 8 --preprocessors 6 --source-size 256 --image-size 24 \
    --timeout 300 --wait-timeout 120 --keep "$out/e2e" 2>&1 | tail -14
fi

if want 6; then
echo "== 6. a 32-model sweep on 16 cores (8 architectures x 4 learning rates), where the simulator predicts FLEET-G >= 1.5x Baseline; run again to go on"
python3 bench/e2e_cpu.py --trainers 8 --preprocessors 3 --source-size 256 --image-size 24 --sweep 4 \
    --policies fleet-g,baseline,homogeneous --timeout 540 --wait-timeout 120 --keep runs/e2e-sweep 2>&1 | tee "$out/e2e-sweep.log" | tail -12
fi

if want 7; then
echo "== 7. Horovod with NCCL: built against this image's torch, CUDA, NCCL and MPI, then checked"
inc=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
if [ ! -f "$inc/Python.h" ]; then  # the image's Python has no headers: its distribution's -dev package
    deb=$(ls .gpu/libpython3*-dev_*_amd64.deb | head -1)
    rm -rf /tmp/pydev && dpkg -x "$deb" /tmp/pydev && cp -rn /tmp/pydev/usr/include/. /usr/include/
    echo "Python headers from $(basename "$deb"): $(ls "$inc/Python.h")"
fi
nccl_h=$(ls /usr/include/nccl.h /usr/local/cuda/include/nccl.h 2>/dev/null | head -1)
[ -n "$nccl_h" ] || nccl_h=$(find $(python3 -c 'import nvidia; print(*nvidia.__path__)') -name nccl.h 2>/dev/null | head -1)
nccl_so=$(find "$(dirname "$(dirname "$nccl_h")")" /usr/lib/x86_64-linux-gnu -name 'libnccl.so*' 2>/dev/null | head -1)
mkdir -p /tmp/nccl-lib && ln -sf "$nccl_so" /tmp/nccl-lib/libnccl.so
echo "NCCL: $nccl_h, $nccl_so; nvcc: $(command -v nvcc); mpicxx: $(command -v mpicxx)"
export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_INCLUDE=$(dirname "$nccl_h") HOROVOD_NCCL_LIB=/tmp/nccl-lib \
    HOROVOD_NCCL_LINK=SHARED HOROVOD_BUILD_CUDA_CC_LIST=${HOROVOD_BUILD_CUDA_CC_LIST:-90} \
    HOROVOD_CUDA_HOME=${HOROVOD_CUDA_HOME:-/usr/local/cuda} HOROVOD_SDIST=$(ls .gpu/horovod-*.tar.gz | head -1)
export LD_LIBRARY_PATH=$(dirname "$nccl_so")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
start=$(date +%s)
if bash tools/build-horovod.sh "$(command -v python3)"; then
    echo "build: $(( $(date +%s) - start )) s"
    FLEET_REQUIRE_HOROVOD=1 python3 -m pytest -q -p no:cacheprovider tests/test_collectives.py -k "cuda_engine" 2>&1 | tail -4
    echo "-- the two tests that assumed no Horovod with NCCL / no PYTHONPATH of the machine's own"
    FLEET_REQUIRE_HOROVOD=1 python3 -m pytest -q -p no:cacheprovider tests/test_collectives.py \
        -k "without_nccl or where_it_is_not_built" 2>&1 | tail -2
    echo "-- two ranks of one group on the one GPU, gradients on the device (NCCL refuses a GPU shared by two ranks: what a user sees)"
    timeout 90 python3 - <<'PY'
import subprocess, sys
code = ("from mpi4py import MPI; import torch\n"
        "from fleet.runtime.train.collectives.horovod import HorovodCollective\n"
        "class E:\n"
        "    g = torch.ones(1 << 20, device='cuda:0')\n"
        "    def gradient_buffer(self): return self.g\n"
        "    def load_flat_gradients(self, g): pass\n"
        "c = HorovodCollective(MPI.COMM_WORLD, 'cuda:0', 30.0)\n"
        "e = E(); c.allreduce_gradients(e); print('sum', e.g[0].item())\n")
p = subprocess.run(["mpiexec", "-n", "2", sys.executable, "-c", code], capture_output=True, text=True, timeout=80)
print("exit", p.returncode); print("\n".join((p.stdout + p.stderr).strip().splitlines()[-6:]))
PY
    for poll in auto sleep; do
        echo "-- bench/collectives.py on $(nproc) cores, --poll $poll"
        timeout 120 python3 bench/collectives.py --repeats 9 --poll $poll --json "$out/collectives-16core-$poll.json" 2>&1 | tail -12
    done
else
    cp /tmp/build-horovod-*.log "$out/" 2>/dev/null; echo "build failed after $(( $(date +%s) - start )) s"
fi
fi

if want 8; then
echo "== 8. policy baseline on the GPU: the trainer decodes its own stream in a thread beside CUDA training"
[ -f "$out/quickstart-gpu.yaml" ] || { echo "step 8 needs step 2's spec"; exit 1; }
python3 - "$out" <<'PY'
import sys, yaml
out = sys.argv[1]
spec = yaml.safe_load(open(f"{out}/quickstart-gpu.yaml"))
spec["scheduler"] = {"policy": "baseline"}
yaml.safe_dump(spec, open(f"{out}/baseline-gpu.yaml", "w"))
PY
start=$(date +%s.%N)
python3 -m fleet run "$out/baseline-gpu.yaml" --run-dir "$out/bl-run" 2>&1 | tail -6
end=$(date +%s.%N)
python3 - "$out" "$start" "$end" <<'PY'
import json, sys
run = f"{sys.argv[1]}/bl-run"
r = json.load(open(f"{run}/results.json"))
events = [json.loads(line) for line in open(f"{run}/events.jsonl")]
starts = [e for e in events if e["event"] == "stream_start"]
own = sum(bool(e.get("own_decoding")) for e in starts)
print(f"baseline on the GPU: wall {float(sys.argv[3]) - float(sys.argv[2]):.1f} s, makespan {r['makespan_s']:.1f} s, "
      f"{len(r['models'])} models, {own} of {len(starts)} streams decoded by their own trainer, "
      f"decoded {r['samples_decoded']}")
for m in r["models"]:
    print(f"  {m['id']:<14} epochs {len(m['history'])}  best acc {m['best_val_accuracy']:.3f}")
PY
fi

if want 9; then
echo "== 9. early stopping on the GPU: examples/asha.yaml (36 configurations, max 8 epochs) with none, asha, sha"
python3 -m fleet data make synthetic --format jpeg --out "$out/qs-data" --force --quiet \
    --classes 10 --samples 2400 --image-size 20 --channels 3 --seed 0
for method in asha none sha; do
    python3 - "$out" "$method" <<'PY'
import sys, yaml
out, method = sys.argv[1:]
spec = yaml.safe_load(open("examples/asha.yaml"))
spec["data"]["path"] = f"{out}/qs-data"
spec["cluster"] = {"nodes": 1, "gpus_per_node": 1, "preprocessors_per_node": 3, "device": "cuda"}
spec["scheduler"]["early_stop"]["method"] = method
yaml.safe_dump(spec, open(f"{out}/asha-{method}.yaml", "w"))
PY
    start=$(date +%s.%N)
    timeout 280 python3 -m fleet run "$out/asha-$method.yaml" --run-dir "$out/asha-$method" --quiet > "$out/asha-$method.log" 2>&1
    code=$?
    end=$(date +%s.%N)
    python3 - "$out/asha-$method" "$method" "$start" "$end" "$code" <<'PY'
import json, sys
run, method, start, end, code = sys.argv[1:]
try:
    r = json.load(open(f"{run}/results.json"))
except OSError:
    print(f"{method}: exit {code}, no results.json"); sys.exit()
best = sorted((m["best_val_accuracy"] or 0.0 for m in r["models"]), reverse=True)
epochs = sum(m["epochs"] for m in r["models"])
stopped = sum(m.get("stop_reason") == "early_stop" for m in r["models"])
print(f"{method:>5}: exit {code}, wall {float(end) - float(start):6.1f} s, makespan {r['makespan_s']:6.1f} s, "
      f"model-epochs {epochs}, stopped at rungs {stopped}, best {best[0]:.3f}, top-5 mean {sum(best[:5]) / 5:.3f}, "
      f"policy {r['policy']}")
PY
done
python3 -m fleet status "$out/asha-sha" 2>&1 | tail -8
fi
