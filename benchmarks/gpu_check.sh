#!/usr/bin/env bash
# GPU check of issue 46 (speed of one GPU), on ONE CUDA machine, in under 8 minutes: the per-step time
# limits below sum to 420 s (7 min), plus start-up. Assumes `pip install -e .` (or PYTHONPATH=src and a
# `bayesncl` command on PATH) in this Python environment. Prints every figure and writes JSON and logs
# to ${OUT:-gpu_check_out}/ (run dirs go to a temporary folder). Steps, each with its own time limit:
#   1. the real loop, eager (benchmarks/bench_train.py: `pretrain` on synthetic 32 px data, ResNet-18
#      CIFAR stem, batch 256, bf16; 4 epochs, the first not timed)                              [50 s]
#   2. the same with train.compile=true (mode $COMPILE_MODE, default "default"; 5 epochs: the first
#      holds the compile and is reported apart as warm-up)                                       [150 s]
#   3. eager vs compiled next to the target (11,200 pairs/s; aim 20,000) and the projected minutes of
#      200 CIFAR-100 epochs (50,000 pairs each)
#   4. host synchronisations per step (torch.cuda.set_sync_debug_mode): loader, eager step, compiled
#      step; expected 0 / 0 / 0 (the compiled step's graph is step 2's: inductor's cache)     [75 s]
#   5. `bayesncl benchmark` without the plain loop and the per-sample path (no DataLoader workers):
#      CL, NCL and BayesNCL with nothing else in the rounds (issue 46: CL's bf16 arm at 2,773/s vs
#      NCL's 4,540 came after the plain loop's 2 DataLoader workers in every round)                [70 s]
#   6. `bayesncl pretrain` + evaluation on CUDA (2 epochs, synthetic), compile at its default `auto` [50 s]
#   7. more torchrun processes than GPUs: must fail with a one-line error                         [25 s]
# Usage: bash benchmarks/gpu_check.sh            # on the GPU machine
#        DRY_RUN=1 bash benchmarks/gpu_check.sh  # on any CPU in seconds: tiny sizes, compile off,
#                                                # the CUDA-only steps skipped (tests/paper/test_gpu_check.py)
#        COMPILE_MODE=reduce-overhead bash benchmarks/gpu_check.sh   # step 2 with CUDA graphs
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-gpu_check_out}"
RUNS="$(mktemp -d)"
trap 'rm -rf "$RUNS"' EXIT
mkdir -p "$OUT_DIR"
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
DRY="${DRY_RUN:-0}"
SCALE="${LIMIT_SCALE:-$([ "$DRY" = 1 ] && echo 5 || echo 1)}"  # dry run: a shared CPU may be slow
lim() { echo $(( $1 * SCALE )); }
MODE="${COMPILE_MODE:-default}"
PY="${PYTHON:-python}"
if [ "$DRY" = 1 ]; then  # tiny CPU settings: checks the script's plumbing, not the GPU
  LOOP=(data.train_subset=128 data.image_size=16 model.backbone=small_cnn model.proj_hidden=32 model.proj_dim=16
        train.batch_size=32 train.device=cpu train.precision=fp32 train.monitor_samples=0)
  EAGER_EPOCHS=2; COMPILED_EPOCHS=2; COMPILE=false
else
  LOOP=()
  EAGER_EPOCHS=4; COMPILED_EPOCHS=5; COMPILE=true
fi

"$PY" - "$DRY" <<'EOF' | tee "$OUT_DIR/env.txt"
import sys
import torch
print("torch", torch.__version__, "| CUDA", torch.version.cuda, "| devices", torch.cuda.device_count())
if torch.cuda.is_available():
    print("device 0:", torch.cuda.get_device_name(0), "| bf16:", torch.cuda.is_bf16_supported())
elif sys.argv[1] == "1":
    print("dry run on the CPU: tiny sizes, compile off, CUDA-only steps skipped")
else:
    raise SystemExit("no CUDA device: this script is for a GPU machine (DRY_RUN=1 checks it on a CPU)")
EOF
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 1

echo; echo "== 1. the real loop, eager: bench_train.py, $EAGER_EPOCHS epochs   [t=$(elapsed)s, limit 50 s]"
timeout "$(lim 50)" "$PY" benchmarks/bench_train.py --epochs "$EAGER_EPOCHS" --run-dir "$RUNS/eager" \
  "${LOOP[@]}" train.compile=false > "$OUT_DIR/loop_eager.json" 2> "$OUT_DIR/loop_eager.err"
rc=$?; echo "exit $rc"; [ $rc -eq 0 ] && cat "$OUT_DIR/loop_eager.json" || tail -15 "$OUT_DIR/loop_eager.err"

echo; echo "== 2. the real loop, train.compile=$COMPILE (mode $MODE), $COMPILED_EPOCHS epochs   [t=$(elapsed)s, limit 150 s]"
timeout "$(lim 150)" "$PY" benchmarks/bench_train.py --epochs "$COMPILED_EPOCHS" --run-dir "$RUNS/compiled" \
  "${LOOP[@]}" train.compile="$COMPILE" train.compile_mode="$MODE" \
  > "$OUT_DIR/loop_compiled.json" 2> "$OUT_DIR/loop_compiled.err"
rc=$?; echo "exit $rc"; [ $rc -eq 0 ] && cat "$OUT_DIR/loop_compiled.json" || tail -15 "$OUT_DIR/loop_compiled.err"

echo; echo "== 3. eager vs compiled against the target   [t=$(elapsed)s]"
"$PY" - "$OUT_DIR" <<'EOF' | tee "$OUT_DIR/summary.txt"
import json, sys
from pathlib import Path

out, target, aim, pairs = Path(sys.argv[1]), 11_200, 20_000, 200 * 50_000  # 200 CIFAR-100 epochs
print(f"{'real loop':<28}{'pairs/s':>10}{'x target':>10}{'200 ep. CIFAR-100':>19}{'warm-up s':>11}{'first epoch s':>15}")
for name in ("eager", "compiled"):
    try:
        text = (out / f"loop_{name}.json").read_text()  # pretrain's lines, then bench_train's JSON
        r = json.loads(text[text.index("\n{\n") + 1:] if not text.startswith("{") else text)
    except (OSError, ValueError):
        print(f"{name:<28}{'(no result)':>10}")
        continue
    label = f"{name} (compile={r['compile']}, {r['compile_mode']})" if name == "compiled" else name
    rate = r["images_per_s"]
    print(f"{label:<28}{rate:>10,.0f}{rate / target:>10.2f}{pairs / rate / 60:>15.1f} min"
          f"{r['warmup_s']:>11.1f}{r['first_epoch_s']:>15.1f}")
print(f"target {target:,} pairs/s (200 epochs in {pairs / target / 60:.1f} min); aim {aim:,} ({pairs / aim / 60:.1f} min)")
EOF

echo; echo "== 4. host synchronisations per step   [t=$(elapsed)s, limit 75 s]"
if [ "$DRY" = 1 ]; then echo "skipped (dry run: torch.cuda.set_sync_debug_mode needs CUDA)"; else
timeout "$(lim 75)" "$PY" - <<'EOF' 2>&1 | grep -v "prototype feature\|_cuda_set_sync_debug_mode" | tee "$OUT_DIR/syncs.txt"
import collections, warnings
import torch
from bayesncl.paper.benchmark import BenchmarkSettings, _config, _trainer, default_settings

def count(label, fn, n=5):
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(n):
            fn()
    torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    where = collections.Counter(f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message))
    print(f"{label}: {sum(where.values()) / n:.1f} syncs per step (expected 0)")
    for loc, k in where.most_common(8):
        print(f"    {k / n:5.1f}  {loc}")

for compiled in (False, True):
    # channels-last off and bf16, as bench_train's loop: the compiled graph is step 2's (inductor's cache)
    s, device = default_settings(BenchmarkSettings(device="cuda", compile=compiled, channels_last=False))
    step, batches, _ = _trainer(_config(s, "bayesncl", resident=True), device)
    fixed = next(batches)
    for _ in range(3):  # warm-up (and the compile)
        step(fixed)
    torch.cuda.synchronize()
    if not compiled:
        count("loader (batched augmentation, its side stream)", lambda: next(batches))
    count(f"train_step on a fixed batch, {'compiled' if compiled else 'eager'}", lambda: step(fixed))
EOF
fi

echo; echo "== 5. bayesncl benchmark: cl / ncl / bayesncl alone in the rounds   [t=$(elapsed)s, limit 70 s]"
if [ "$DRY" = 1 ]; then echo "skipped (dry run: its demo arms train a ResNet-18 at batch 256)"; else
timeout "$(lim 70)" "$PY" -m bayesncl.paper.benchmark --json --no-plain-compare --no-augment-compare --rounds 3 \
  > "$OUT_DIR/benchmark.json" 2> "$OUT_DIR/benchmark.err"
rc=$?; echo "exit $rc"
if [ $rc -eq 0 ]; then
  "$PY" -c "import json,sys; from bayesncl.paper.benchmark import format_report; print(format_report(json.load(open(sys.argv[1]))))" "$OUT_DIR/benchmark.json"
else tail -10 "$OUT_DIR/benchmark.err"; fi
fi

echo; echo "== 6. bayesncl pretrain + evaluation, 2 epochs   [t=$(elapsed)s, limit 50 s]"
if [ "$DRY" = 1 ]; then E2E=("${LOOP[@]}" data.test_subset=64 eval.batch_size=64); else E2E=(model.cifar_stem=true train.batch_size=256); fi
timeout "$(lim 50)" "$PY" -m bayesncl pretrain --run-dir "$RUNS/pretrain" data.name=synthetic train.epochs=2 \
  train.warmup_epochs=1 train.progress=false "${E2E[@]}" > "$OUT_DIR/pretrain.log" 2>&1
rc=$?; echo "exit $rc"; tail -6 "$OUT_DIR/pretrain.log"
[ -f "$RUNS/pretrain/log.csv" ] && cp "$RUNS/pretrain/log.csv" "$OUT_DIR/pretrain_log.csv"

echo; echo "== 7. more processes than GPUs must be a one-line error   [t=$(elapsed)s, limit 25 s]"
if [ "$DRY" = 1 ]; then echo "skipped (dry run: needs CUDA)"; else
n=$("$PY" -c "import torch; print(torch.cuda.device_count() + 1)")
timeout "$(lim 25)" torchrun --standalone --nproc_per_node="$n" -m bayesncl pretrain --run-dir "$RUNS/too-many" \
  data.name=synthetic train.epochs=1 train.device=cuda > "$OUT_DIR/too_many.log" 2>&1
rc=$?
if grep -q "bayesncl: error: .*processes on this node but only" "$OUT_DIR/too_many.log"; then
  echo "ok (torchrun exit $rc): $(grep -m1 'bayesncl: error' "$OUT_DIR/too_many.log")"
else
  echo "UNEXPECTED (torchrun exit $rc):"; tail -15 "$OUT_DIR/too_many.log"
fi
fi

echo; echo "done in $(elapsed)s; JSON and logs in $OUT_DIR/"
