#!/usr/bin/env bash
# GPU check for the "scale and speed" issue, on ONE CUDA machine, in about 7 minutes (BUDGET, default 420 s).
#
# Assumes `pip install -e .` has been done in this Python environment. Prints every figure and
# writes the JSON files to ${OUT:-gpu_check_out}/ (run dirs go to a temporary folder, so nothing
# large lands in $OUT). Steps, each with its own time limit:
#   1. `bayesncl benchmark --json` with the GPU defaults (ResNet-18 CIFAR stem, batch 256, 32 px,
#      bf16 autocast, channels_last, 3 rounds): images/s of CL/NCL/BayesNCL, gate overhead, FLOPs, per-sample
#      vs batched augmentation; target >= 11,200 images (pairs)/s on one H200.
#   2. the real loop, benchmarks/bench_train.py: `pretrain` on synthetic 32 px data, 6 epochs.
#   3. `bayesncl pretrain` + evaluation end to end on CUDA (2 epochs, synthetic data).
#   4. more torchrun processes than GPUs: must fail with a one-line error.
#   5. host synchronisations per step: the loader and the train step, counted separately.
#   6. if time is left (BUDGET s in all): the benchmark again with torch.compile.
# Usage: bash benchmarks/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-gpu_check_out}"
RUNS="$(mktemp -d)"
mkdir -p "$OUT_DIR"
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }

python - <<'EOF' | tee "$OUT_DIR/env.txt"
import torch
print("torch", torch.__version__, "| CUDA", torch.version.cuda, "| devices", torch.cuda.device_count())
if torch.cuda.is_available():
    print("device 0:", torch.cuda.get_device_name(0), "| bf16:", torch.cuda.is_bf16_supported())
else:
    raise SystemExit("no CUDA device: this script is for a GPU machine")
EOF
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 1

if bayesncl benchmark --help >/dev/null 2>&1; then BENCH=(bayesncl benchmark); else BENCH=(python -m bayesncl.paper.benchmark); fi
show() {  # print a benchmark JSON file as the human-readable table
  python -c "import json,sys; from bayesncl.paper.benchmark import format_report; print(format_report(json.load(open(sys.argv[1]))))" "$1"
}

echo; echo "== 1. ${BENCH[*]} --json (GPU defaults)   [t=$(elapsed)s]"
timeout 240 "${BENCH[@]}" --json --rounds 3 > "$OUT_DIR/benchmark.json" 2> "$OUT_DIR/benchmark.err"
rc=$?; echo "exit $rc"
if [ $rc -eq 0 ]; then show "$OUT_DIR/benchmark.json"; else tail -20 "$OUT_DIR/benchmark.err"; fi
grep '^\.\.\.' "$OUT_DIR/benchmark.err" | tail -3  # how far it got

echo; echo "== 2. the real loop: benchmarks/bench_train.py, 6 epochs of 5000 synthetic images   [t=$(elapsed)s]"
timeout 100 python benchmarks/bench_train.py --epochs 6 --run-dir "$RUNS/bench-train" \
  > "$OUT_DIR/bench_train.json" 2> "$OUT_DIR/bench_train.err"
rc=$?; echo "exit $rc"
if [ $rc -eq 0 ]; then cat "$OUT_DIR/bench_train.json"; else tail -20 "$OUT_DIR/bench_train.err"; fi

echo; echo "== 3. bayesncl pretrain + evaluation on CUDA, 2 epochs   [t=$(elapsed)s]"
timeout 90 bayesncl pretrain --run-dir "$RUNS/pretrain" data.name=synthetic model.cifar_stem=true \
  train.epochs=2 train.batch_size=256 train.warmup_epochs=1 train.progress=false \
  > "$OUT_DIR/pretrain.log" 2>&1
rc=$?; echo "exit $rc"; tail -8 "$OUT_DIR/pretrain.log"
[ -f "$RUNS/pretrain/log.csv" ] && cp "$RUNS/pretrain/log.csv" "$OUT_DIR/pretrain_log.csv" && cat "$OUT_DIR/pretrain_log.csv"
[ -f "$RUNS/pretrain/metrics.json" ] && cp "$RUNS/pretrain/metrics.json" "$OUT_DIR/pretrain_metrics.json"

echo; echo "== 4. more processes than GPUs must be a one-line error   [t=$(elapsed)s]"
n=$(python -c "import torch; print(torch.cuda.device_count() + 1)")
timeout 60 torchrun --standalone --nproc_per_node="$n" -m bayesncl pretrain --run-dir "$RUNS/too-many" \
  data.name=synthetic train.epochs=1 train.device=cuda > "$OUT_DIR/too_many.log" 2>&1
rc=$?
if grep -q "bayesncl: error: .*processes on this node but only" "$OUT_DIR/too_many.log"; then
  echo "ok (torchrun exit $rc): $(grep -m1 'bayesncl: error' "$OUT_DIR/too_many.log")"
else
  echo "UNEXPECTED (torchrun exit $rc):"; tail -15 "$OUT_DIR/too_many.log"
fi

echo; echo "== 5. host synchronisations per training step (torch.cuda.set_sync_debug_mode)   [t=$(elapsed)s]"
timeout 60 python - <<'EOF' 2>&1 | tee "$OUT_DIR/syncs.txt"
import collections, warnings
import torch
from bayesncl.paper.benchmark import BenchmarkSettings, _config, _trainer, default_settings

s, device = default_settings(BenchmarkSettings(device="cuda"))
step, batches, _ = _trainer(_config(s, "bayesncl", resident=True), device)
fixed = next(batches)
for _ in range(3):
    step(None)
torch.cuda.synchronize()

def count(label, fn, n=5):
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(n):
            fn()
    torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    where = collections.Counter(f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message))
    print(f"{label}: {sum(where.values()) / n:.1f} syncs per step")
    for loc, k in where.most_common(8):
        print(f"    {k / n:5.1f}  {loc}")

count("loader (batched augmentation, on its side stream in training)", lambda: next(batches))
count("train_step on a fixed batch (forward, backward, LARS)", lambda: step(fixed))
EOF

left=$(( ${BUDGET:-420} - $(elapsed) ))
echo; echo "== 6. benchmark with torch.compile (limit ${left}s)   [t=$(elapsed)s]"
if [ "$left" -gt 60 ]; then
  timeout "$left" "${BENCH[@]}" --json --compile --no-augment-compare --rounds 3 \
    > "$OUT_DIR/benchmark_compile.json" 2> "$OUT_DIR/benchmark_compile.err"
  rc=$?; echo "exit $rc"
  if [ $rc -eq 0 ]; then show "$OUT_DIR/benchmark_compile.json"; else tail -5 "$OUT_DIR/benchmark_compile.err"; fi
else
  echo "skipped: not enough time left"
fi
rm -rf "$RUNS"
echo; echo "done in $(elapsed)s; JSON and logs in $OUT_DIR/"
