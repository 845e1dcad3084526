#!/usr/bin/env bash
# One GPU call that measures everything the fused kernels owe, in at most ~10 minutes (595 s of timeouts):
#
#   run(command="bash benchmarks/gpu_check.sh", carry=["benchmarks/wheels"], timeout_s=600)
#   bash benchmarks/gpu_check.sh [--smoke] [OUT_DIR]        # OUT_DIR defaults to $OUT, else ./gpu_check_out
#
# Sections, each under its own `timeout` so a slow one cannot starve the rest:
#   1. tests    the kernel tests (tests/kernels) compiled for the GPU (TRITON_INTERPRET=0), xdist over 8 workers: every
#               kind (the gated RMSNorm, l2norm, DyT, Derf, per-head weights included), norm-then-add, the
#               memory-efficient backward, and Nemotron's LayerNorm under CUDA autocast (a GPU-only test)
#   2. kernels  benchmarks/kernels/bench_norm_kernels.py: ours vs torch eager, torch.compile, Liger-Kernel (flash-attn,
#               quack, cuDNN through Transformer Engine where importable), L2 flushed before every repetition, each cell
#               as % of a copy of the same bytes; targets fwd >= 90%, bwd >= 80% for N >= 2048; LayerNorm and RMSNorm
#               at N = 1024 ... 16384, the gated RMSNorm, l2norm, DyT (Liger's too) and Derf at N = 4096 and 16384
#   3. models   benchmarks/models/bench_gpu_models.py: GPT-2-small bf16 train step (fused vs backend="torch" vs HF
#               GPT2LMHeadModel; tokens/s, peak memory; under set_sync_debug_mode("error"); in a CUDA graph) and an
#               HF Llama-shaped fwd+bwd (unpatched vs lnblocks.hf.patch_norms vs Liger's RMSNorm patch)
#   4. study    one run of `lnblocks study run` on the GPU in bf16, and the backends its record names
#   5. hf       benchmarks/hf/bench_hf_training.py: an HF Llama-shaped model in bf16, transformers.Trainer step and
#               forward, unpatched vs lnblocks.hf.patch_norms vs patch_norms(fuse_residual=True), paired ratios
#   6. resume   a bf16 study run with train.deterministic and checkpoints, SIGKILLed mid-run (LNBLOCKS_CHECKPOINT_FAULT)
#               and resumed, against the uninterrupted run: "bit-identical" or the fields that differ (docs/long-runs.md)
#   7. vocab    benchmarks/study/bench_study_step.py --device cuda: the study's training step at V = 256, 30,522,
#               50,257 with the full logits vs the chunked LM head: step time and peak memory (table in summary)
#   8. hfloss   benchmarks/hf/bench_hf_chunked_loss.py --device cuda: an HF Llama-shaped bf16 step and its loss alone
#               at V = 32k, 128k, 256k, full logits vs lnblocks.hf's chunked_loss=True: time, peak memory (summary)
# Writes at most 8 files into the output folder: summary.txt, check.log, tests.log, kernels.md, kernels.json,
# models.json, study.log, hf.json (and nothing else); prints the summary last.
#
# The GPU machine has no package registry: Liger-Kernel travels as a wheel. Prepare the folder once, where pip
# reaches PyPI (benchmarks/wheels/ is git-ignored; the GPU machine runs Python 3.12):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d benchmarks/wheels liger-kernel==0.8.5 \
#     accelerate==1.15.0
# and name it in the call's `carry`. quack and Transformer Engine cannot travel this way (the kernel benchmark names
# them "not importable" unless the machine has them; benchmarks/kernels/README.md, "Contenders"): quack-kernels
# 0.6.5 needs nvidia-cutlass-dsl-libs-cu12 (a 92 MB wheel, over the 64 MiB a call may carry), and transformer-engine
# 2.20.2's PyTorch extension (transformer_engine_torch) is published as source only, built against the local torch
# and CUDA toolkit at install time. The wheels are installed with `pip install --no-index --no-deps --target` into a
# temporary folder; lnblocks itself is imported from this checkout (PYTHONPATH), the machine's torch, triton,
# transformers, pytest-xdist, einops, pyyaml, tqdm and matplotlib are used as they are.
#
# --smoke runs the whole script on CPU in CI-size time (tiny shapes, kernels in Triton's interpreter, a few tests),
# so it cannot rot; tests/test_gpu_check_smoke.py runs it.
set -uo pipefail
SMOKE=0
if [ "${1:-}" = "--smoke" ]; then SMOKE=1; shift; fi
OUT=${1:-${OUT:-$PWD/gpu_check_out}}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
SITE=$(mktemp -d)
WORK=$(mktemp -d)
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ "$SMOKE" = 1 ]; then
  export TRITON_INTERPRET=1
  T_TESTS=120 T_KERNELS=120 T_MODELS=240 T_STUDY=120 T_HF=120 T_RESUME=180 T_VOCAB=120 T_HFLOSS=120
else
  export TRITON_INTERPRET=0
  T_TESTS=${T_TESTS:-115} T_KERNELS=${T_KERNELS:-140} T_MODELS=${T_MODELS:-110} T_STUDY=${T_STUDY:-50}
  T_HF=${T_HF:-45} T_RESUME=${T_RESUME:-60} T_VOCAB=${T_VOCAB:-45} T_HFLOSS=${T_HFLOSS:-30}
fi
SUMMARY="$OUT/summary.txt"
LOG="$OUT/check.log"
: >"$LOG"

{
  echo "gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) smoke=$SMOKE"
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader 2>/dev/null \
    || echo "nvidia-smi: not available"
  $PY -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', \
triton.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name())" 2>&1
} >"$SUMMARY"

# ---- set-up: carried wheels ------------------------------------------------------------------------------------------
if compgen -G "benchmarks/wheels/*.whl" >/dev/null; then
  if $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" benchmarks/wheels/*.whl \
    >>"$LOG" 2>&1; then
    echo "wheels: installed $(ls benchmarks/wheels/*.whl | xargs -n1 basename | tr '\n' ' ')" >>"$SUMMARY"
  else
    echo "wheels: install FAILED (see check.log)" >>"$SUMMARY"
  fi
else
  echo "wheels: benchmarks/wheels/ has none (Liger-Kernel will be reported as not importable)" >>"$SUMMARY"
fi

# section NAME SECONDS COMMAND...: runs COMMAND under `timeout`, appends its output to check.log, records the status
section() {
  local name=$1 limit=$2 t0 rc
  shift 2
  t0=$(date +%s)
  echo "===== $name (limit ${limit}s): $*" >>"$LOG"
  timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
  rc=$?
  local how="exit $rc"
  if [ $rc = 124 ] || [ $rc = 137 ]; then how="TIMED OUT (exit $rc)"; fi
  echo "$name: $how after $(($(date +%s) - t0)) s" | tee -a "$LOG" >>"$SUMMARY"
}

# ---- 1. kernel tests on the GPU ------------------------------------------------------------------------------------
if [ "$SMOKE" = 1 ]; then
  TEST_ARGS="tests/kernels/test_kernel_accuracy.py -k 'small_blocks and 33'"
else
  TEST_ARGS="tests/kernels -n 8"
fi
section tests "$T_TESTS" bash -c "$PY -m pytest $TEST_ARGS -q -p no:cacheprovider -o addopts='' \
  >'$OUT/tests.log' 2>&1; rc=\$?; tail -n 15 '$OUT/tests.log'; exit \$rc"

# ---- 2. kernel benchmark -------------------------------------------------------------------------------------------
if [ "$SMOKE" = 1 ]; then
  section kernels "$T_KERNELS" $PY benchmarks/kernels/bench_norm_kernels.py --smoke --no-plot --out "$OUT/kernels"
else
  section kernels "$T_KERNELS" $PY benchmarks/kernels/bench_norm_kernels.py --out "$OUT/kernels" --budget-s 90 \
    --variants --no-plot
fi
if [ ! -f "$OUT/kernels.md" ] && [ -f "$OUT/kernels.json" ]; then  # cut off: the report from what was measured
  $PY benchmarks/kernels/bench_norm_kernels.py --out "$OUT/kernels" --report-only --no-plot >/dev/null 2>>"$LOG"
fi

# ---- 3. models -----------------------------------------------------------------------------------------------------
section models "$T_MODELS" $PY benchmarks/models/bench_gpu_models.py --out "$OUT/models" \
  $([ "$SMOKE" = 1 ] && echo --smoke)

# ---- 4. one study run in bf16 --------------------------------------------------------------------------------------
if [ "$SMOKE" = 1 ]; then
  STUDY_SIZE="dim: 32, n_heads: 4, depth: 1" STUDY_DATA="vocab_size: 16, seq_len: 16, batch_size: 8"
  STUDY_TRAIN="steps: 5, device: cpu" STUDY_EVERY=5
else
  STUDY_SIZE="dim: 256, n_heads: 4, depth: 4" STUDY_DATA="vocab_size: 64, seq_len: 128, batch_size: 32"
  STUDY_TRAIN="steps: 300, device: cuda" STUDY_EVERY=100
fi
cat >"$WORK/gpu_check.yaml" <<YAML
name: gpu_check
description: one bf16 run of the placement study, from benchmarks/gpu_check.sh
data: {source: markov, $STUDY_DATA, eval_batches: 2}
model: {$STUDY_SIZE, activation: relu, init: xavier}
train: {$STUDY_TRAIN, dtype: bf16, optimizer: {name: adam, beta2: 0.98}}
diagnostics: {every: $STUDY_EVERY, init_grad_batches: 1, probe_batch_size: 4}
grid: {model.placement: [pre]}
YAML
section study "$T_STUDY" bash -c "$PY -m lnblocks.cli study run '$WORK/gpu_check.yaml' --out '$WORK/study' \
  >'$OUT/study.log' 2>&1; rc=\$?; tail -n 5 '$OUT/study.log'; exit \$rc"
$PY - "$WORK/study" >>"$OUT/study.log" 2>&1 <<'PY'
import glob, json, sys
files = sorted(glob.glob(f"{sys.argv[1]}/runs/*.json"))
if not files:
    print("study record: none written")
    sys.exit()
rec = json.load(open(files[0]))
def backends(obj, path=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from backends(v, f"{path}.{k}" if path else k)
    elif "backend" in path:
        yield f"{path}={obj}"
found = list(backends(rec))
print(f"study record: status={rec.get('status')} device={rec.get('env', {}).get('device')} "
      f"dtype={rec.get('config', {}).get('train', {}).get('dtype')} step_ms={rec.get('time', {}).get('step_ms')}")
print("record backends:", ", ".join(found) if found else "none recorded")
if not any("norm" in f for f in found):
    print("note: this study version records no norm backend (the GPT's norms use backend='auto': fused on CUDA)")
PY
tail -n 4 "$OUT/study.log" >>"$SUMMARY"

# ---- 5. HF training stacks: Trainer step and forward, unpatched / patched / fused residual -----------------------
if [ "$SMOKE" = 1 ]; then
  section hf "$T_HF" $PY benchmarks/hf/bench_hf_training.py --smoke --out "$OUT/hf"
else
  section hf "$T_HF" $PY benchmarks/hf/bench_hf_training.py --device cuda --rounds 5 --out "$OUT/hf"
fi

# ---- 6. resume bit for bit: deterministic kernels, a SIGKILL mid-run, the rerun against the uninterrupted run ------
if [ "$SMOKE" = 1 ]; then RESUME_DEVICE=cpu RESUME_STEPS=20 RESUME_EVERY=5; else
  RESUME_DEVICE=cuda RESUME_STEPS=120 RESUME_EVERY=40; fi
cat >"$WORK/resume.yaml" <<YAML
name: gpu_check_resume
description: bit-identical resume on the GPU, from benchmarks/gpu_check.sh
data: {source: markov, $STUDY_DATA, eval_batches: 2}
model: {$STUDY_SIZE, activation: relu, init: xavier, dropout: 0.1}
train: {steps: $RESUME_STEPS, device: $RESUME_DEVICE, dtype: bf16, deterministic: true, grad_accum: 2, z_loss: 1.0e-4,
        warmup: 10, schedule: cosine, checkpoint: {every: $RESUME_EVERY}, optimizer: {name: adamw, weight_decay: 0.1}}
diagnostics: {every: $RESUME_EVERY, init_grad_batches: 1, probe_batch_size: 4}
grid: {model.placement: [post]}
YAML
cat >"$WORK/resume.py" <<'PY'
import glob, json, os, subprocess, sys
work, py = sys.argv[1], sys.executable
cfg, kill_at = f"{work}/resume.yaml", int(sys.argv[2])
def study(out, fault=None):
    env = {**os.environ, **({"LNBLOCKS_CHECKPOINT_FAULT": fault} if fault else {})}
    cmd = [py, "-m", "lnblocks.cli", "study", "run", cfg, "--out", out, "--set", "analysis.init_profile.batches=1"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True).returncode
assert study(f"{work}/a") == 0, "the uninterrupted run failed"
assert study(f"{work}/b", f"kill-at-step@{kill_at}") == -9, "the killed run was not killed"
assert study(f"{work}/b") == 0, "the resumed run failed"
def record(out):
    rec = json.load(open(glob.glob(f"{out}/runs/*.json")[0]))
    env = rec.pop("env")
    rec.pop("time")
    return rec, env
(a, _), (b, env) = record(f"{work}/a"), record(f"{work}/b")
diff = sorted(k for k in a if a[k] != b[k]) + sorted(k for k in a["result"] if a["result"][k] != b["result"][k])
print(f"resume: device {env['device']}, killed at step {kill_at}, resumed from {env.get('resumed_from')}: "
      + ("bit-identical to the uninterrupted run" if not diff else f"DIFFERS in {diff}"))
sys.exit(1 if diff or not env.get("resumed_from") else 0)
PY
section resume "$T_RESUME" bash -c "$PY '$WORK/resume.py' '$WORK' $((RESUME_STEPS / 2 + 3)) >>'$OUT/study.log' 2>&1; \
  rc=\$?; tail -n 1 '$OUT/study.log'; exit \$rc"
grep '^resume:' "$OUT/study.log" >>"$SUMMARY" || echo "resume: no result (see study.log)" >>"$SUMMARY"

# ---- 7. the study's step at real vocabularies: full logits vs the chunked LM head ---------------------------------
if [ "$SMOKE" = 1 ]; then
  VOCAB_ARGS="--smoke"
else
  VOCAB_ARGS="--device cuda --rounds 1 --steps 20 --warmup 3"
fi
section vocab "$T_VOCAB" bash -c "$PY benchmarks/study/bench_study_step.py $VOCAB_ARGS >'$WORK/vocab.md' 2>&1; rc=\$?; \
  cat '$WORK/vocab.md'; exit \$rc"

# ---- 8. an HF causal LM's loss at real vocabularies: full logits vs chunked_loss=True ------------------------------
if [ "$SMOKE" = 1 ]; then HFLOSS_ARGS="--smoke"; else HFLOSS_ARGS="--device cuda --rounds 2 --repeat 3"; fi
section hfloss "$T_HFLOSS" bash -c "$PY benchmarks/hf/bench_hf_chunked_loss.py $HFLOSS_ARGS >'$WORK/hfloss.md' \
  2>&1; rc=\$?; tail -n 8 '$WORK/hfloss.md'; exit \$rc"

# ---- summary, printed last ------------------------------------------------------------------------------------------
{
  echo
  if [ -f "$OUT/kernels.md" ]; then sed -n '/### Summary/,$p' "$OUT/kernels.md"; else echo "kernels: no report"; fi
  echo
  if [ -f "$OUT/models.json" ]; then
    $PY benchmarks/models/bench_gpu_models.py --out "$OUT/models" --report-only 2>&1
  else
    echo "models: no results"
  fi
  echo
  if [ -f "$OUT/hf.json" ]; then
    $PY benchmarks/hf/bench_hf_training.py --report "$OUT/hf.json" 2>&1
  else
    echo "hf: no results"
  fi
  echo
  echo "### Study step at real vocabularies (bench_study_step.py $VOCAB_ARGS)"
  grep -E '^(B=|\|)' "$WORK/vocab.md" 2>/dev/null || echo "vocab: no results"
  echo
  echo "### HF causal LM, full logits vs chunked_loss=True (bench_hf_chunked_loss.py $HFLOSS_ARGS)"
  grep -E '^(Llama-shaped|\|)' "$WORK/hfloss.md" 2>/dev/null || echo "hfloss: no results"
} >>"$SUMMARY"
rm -rf "$SITE" "$WORK"
cat "$SUMMARY"
