#!/usr/bin/env bash
# The CUDA path end to end on a GPU machine, in one prepared run of a few minutes (issue 40):
#   1. the machine: GPU, driver, Python, torch, numba, cores, RAM, disk (env.txt);
#   2. pytest tests/test_device.py (the CUDA tests, skipped elsewhere: GPU vs CPU losses of 3 steps of
#      sage, gat and gin on `tiny`, whole runs of three policies, the layers against the CPU kernels) and
#      the distributed GPU test (pytest.xml);
#   3. benchmarks/train.py --device cuda on $PRESET under $BUDGET for $POLICIES, one epoch each:
#      per-stage seconds, the copies' overlap with compute (CUDA events), reads against the disk's
#      limits measured in the same run (train.csv, train-results.json).
# Everything goes under one folder: the first argument, else $OUT, else data/gpu-check (gpu-check.log
# holds the whole output). No network and no install: what is missing is one line and exit 2.
#
#   benchmarks/gpu_check.sh [FOLDER]            (make gpu-check [OUT=FOLDER])
#   environment: PYTHON (default .venv/bin/python where it exists, else python3), PRESET (medium),
#                PARTS (1024), BUDGET (128MB: medium's features are 4x that),
#                POLICIES (inmemory,hierbatching,hierbatching-p1,outre,ginex,marius), SUPERBATCH (4: Ginex's S that fits
#                medium at 128MB; 16 needs 199 MiB), DATA (data: where the store is made or reused),
#                DEVICE (cuda; cpu runs the same steps without a GPU, the CUDA tests skipped),
#                FEATURE_DTYPES (float32; e.g. float32,int8 also runs each policy on an int8 store: issue 38)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-data/gpu-check}}
if [[ -x .venv/bin/python ]]; then default_python=.venv/bin/python; else default_python=python3; fi
py=${PYTHON:-$default_python}
preset=${PRESET:-medium} parts=${PARTS:-1024} budget=${BUDGET:-128MB}
policies=${POLICIES:-inmemory,hierbatching,hierbatching-p1,outre,ginex,marius} device=${DEVICE:-cuda}
superbatch=${SUPERBATCH:-4} data=${DATA:-data} dtypes=${FEATURE_DTYPES:-float32}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

# what the check needs, before anything runs: one line and exit 2 when something is missing
"$py" - "$device" <<'EOF' || exit 2
import importlib.util, sys
need = ("numpy", "torch", "numba", "pandas", "tqdm", "matplotlib", "pytest")
missing = [m for m in need if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu-check: {sys.executable} lacks {', '.join(missing)}: bring them as wheels "
             "(pip download --only-binary=:all: ...) and install them first, or set PYTHON")
import torch
if sys.argv[1].startswith("cuda") and not torch.cuda.is_available():
    sys.exit(f"gpu-check: torch {torch.__version__} sees no CUDA device "
             f"({'built without CUDA' if torch.version.cuda is None else 'none visible'}); run it on a GPU machine")
EOF
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
exec > >(tee "$out/gpu-check.log") 2>&1
t0=$SECONDS
step() { echo; echo "== $1 ($((SECONDS - t0)) s)"; }

step "the machine"
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  "$py" -c 'import sys, torch, numba, numpy; print("python", sys.version.split()[0], "| torch", torch.__version__,
"| cuda", torch.version.cuda, "| numba", numba.__version__, "| numpy", numpy.__version__);
print("gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else None)'
  echo "cores $(nproc), $(free -g | awk '/Mem:/ {print $2}') GiB RAM, disk free $(df -h --output=avail . | tail -1)"
  echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$out/env.txt"

step "pytest tests/test_device.py and the distributed GPU test"
"$py" -m pytest -q -rs -p no:cacheprovider --junitxml="$out/pytest.xml" tests/test_device.py \
  "tests/test_distributed.py::test_ranks_on_a_gpu_train_as_on_the_cpu"
tests_rc=$?

step "benchmarks/train.py --device $device --preset $preset --budget $budget"
"$py" benchmarks/train.py --device "$device" --preset "$preset" --parts "$parts" --budget "$budget" \
  --policies "$policies" --superbatch "$superbatch" --limit none --data "$data" --csv "$out/train.csv" \
  --feature-dtypes "$dtypes"
bench_rc=$?
cp "$data/bench/train-results.json" "$out/" 2>/dev/null

step "done: tests exit $tests_rc, benchmark exit $bench_rc; files in $out"
ls -l "$out"
[[ $tests_rc == 0 && $bench_rc == 0 ]]
