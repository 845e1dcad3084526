#!/usr/bin/env bash
# GPU check of the fused norm kernels (issue 3), prepared for ONE call of the device tool (timeout_s=600):
#
#   run(command="bash benchmarks/gpu_check.sh", timeout_s=600)
#
# 1. the kernel tests (tests/kernels) compiled for the GPU, without the interpreter (TRITON_INTERPRET=0 makes them
#    allocate on CUDA; xdist spreads the Triton compiles over the CPU cores), at most 240 s;
# 2. the benchmark, at most 300 s (torch.compile stops compiling after --budget-s; the JSON is rewritten after every
#    configuration, so a cut-off run still returns what it measured).
# Results land in $OUT (<= 8 files): env.txt, tests.log, tests.xml, bench.log, bench.md, bench.json, bench.png.
# Uses the machine's python3 (torch + triton + pytest-xdist there); lnblocks is imported from this checkout.
set -uo pipefail
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 TRITON_DEFAULT_FP_FUSION=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
} >"$OUT/env.txt" 2>&1

t0=$(date +%s)
timeout 240 $PY -m pytest tests/kernels -q -n 8 -p no:cacheprovider -o addopts="" \
  --junitxml="$OUT/tests.xml" >"$OUT/tests.log" 2>&1
echo "tests: exit $? after $(($(date +%s) - t0)) s" | tee -a "$OUT/env.txt"
tail -n 25 "$OUT/tests.log"

t0=$(date +%s)
timeout 300 $PY benchmarks/bench_norm_kernels.py --out "$OUT/bench" --budget-s 170 --variants >"$OUT/bench.log" 2>&1
echo "bench: exit $? after $(($(date +%s) - t0)) s" | tee -a "$OUT/env.txt"
if [ ! -f "$OUT/bench.md" ] && [ -f "$OUT/bench.json" ]; then  # cut off: build the report from what was measured
  $PY benchmarks/bench_norm_kernels.py --out "$OUT/bench" --report-only >/dev/null 2>>"$OUT/bench.log"
fi
if [ -f "$OUT/bench.md" ]; then sed -n '/### Summary/,$p' "$OUT/bench.md"; else tail -n 20 "$OUT/bench.log"; fi
