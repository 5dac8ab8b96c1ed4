#!/usr/bin/env bash
# bench/gpu/torch.sh — issue #32's training part on a CUDA machine without Node: Conduit's torch worker
# (src/train/torch/worker.py, driven directly with the jobs bench/gpu/stageTorch.sh prepared) against the bare
# PEFT peer (bench/peft_peer.py) on the same windows, GPU and dtype (bf16), for SmolLM2-135M and a ~1B model of
# TinyLlama's shape; then the dates task, whose adapter and probe logits come back for bench/gpu/checkAdapter.ts.
#
#   bash bench/gpu/torch.sh        # after `bench/gpu/run.sh unpack` (SmolLM2 in .cache/models, node in .device/rt)
#
# BUDGET (seconds, default 300) bounds the whole script. Writes $OUT/torch.tar (the worker's and the peer's output, the dates adapter and probe) and
# $OUT/torch-summary.txt, and prints the summary last. Every step runs under `timeout`.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
T0=$SECONDS
OUT="${OUT:-$ROOT/.cache/gpu-out}"
T="$ROOT/.device/train"
R="$T/results"
rm -rf "$R"
mkdir -p "$OUT" "$R" "$T/models"
PY="${PYTHON:-python3}"
NODE="${NODE:-$ROOT/.device/rt/bin/node}"
SUMMARY="$OUT/torch-summary.txt"
: > "$SUMMARY"
log() { printf '[torch %4ds] %s\n' "$((SECONDS - T0))" "$*" | tee -a "$R/log.txt"; }
BUDGET="${BUDGET:-300}"   # seconds for the whole script: a step gets what is left of it, later steps are skipped
step() {
  local name=$1 limit=$2 out=$3; shift 3
  local left=$((BUDGET - (SECONDS - T0)))
  if [ "$left" -lt 15 ]; then
    log "── $name: skipped (${left}s of the ${BUDGET}s budget left)"
    echo "SKIPPED: $name (budget)" >> "$SUMMARY"
    return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  log "── $name (timeout ${limit}s)"
  local t=$SECONDS
  timeout -k 10 "$limit" "$@" > "$out" 2>> "$R/stderr.txt"
  local rc=$?
  log "── $name: rc=$rc in $((SECONDS - t))s"
  [ "$rc" = 0 ] || echo "FAILED: $name (rc=$rc)" >> "$SUMMARY"
  return $rc
}

# The worker's packages: the image has PyTorch, transformers and PEFT; gguf travels as a wheel.
"$PY" -m pip install -q --no-index --no-deps --target /tmp/torch-site "$T"/wheels/*.whl && export PYTHONPATH=/tmp/torch-site
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TQDM_DISABLE=1 PYTHONUNBUFFERED=1
step probe 60 "$R/probe.json" "$PY" src/train/torch/worker.py --probe
log "$(cat "$R/probe.json")"
"$PY" -m pip list 2>/dev/null | grep -iE '^(torch|transformers|peft|gguf|accelerate) ' > "$R/versions.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$R/gpu.txt" 2>&1

ln -sf "$ROOT/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf" "$T/models/"

model_of() { [ "$1" = smollm2 ] && echo SmolLM2-135M-Instruct.Q4_1.gguf || echo tinyllama-1b-f16.gguf; }
speed() {
  [ -f "$T/models/$(model_of "$1")" ] || { log "no model for $1"; return; }
  step "$1 peer" "$2" "$R/$1.peer.json" "$PY" bench/peft_peer.py "$T/$1/job.json"
  step "$1 worker" "$2" "$R/$1.worker.jsonl" "$PY" src/train/torch/worker.py --job "$T/$1/job.json"
}
speed smollm2 150
step "dates worker" 120 "$R/dates.worker.jsonl" "$PY" src/train/torch/worker.py --job "$T/dates/job.json"
if [ -x "$NODE" ]; then
  step make-1b 120 "$R/make-1b.json" "$NODE" "$T/makeModel.mjs" tinyllama-1b "$T/models/tinyllama-1b-f16.gguf"
else
  log "no node at $NODE: the 1B model cannot be written"
fi
speed tinyllama-1b 150
cp "$T/dates/trained.adapter.f32" "$T/dates/probe.f32" "$R/" 2>/dev/null

"$PY" - "$R" >> "$SUMMARY" <<'PY'
import json, os, sys
r = sys.argv[1]
def done(path):
    try:
        for line in open(path):
            m = json.loads(line)
            if m.get("type") == "done": return m["stats"]
            if m.get("type") == "error": return {"error": m["message"]}
    except Exception as e:
        return {"error": str(e)}
    return {"error": "no result"}
gpu = open(os.path.join(r, "gpu.txt")).read().strip()
print(f"GPU: {gpu}")
print("| model | trainer | tok/s | tok/CPU-s | × peer (tok/s) | first step | peak GPU | peak RSS |")
print("|---|---|---|---|---|---|---|---|")
for job in ("smollm2", "tinyllama-1b"):
    try: peer = json.load(open(os.path.join(r, f"{job}.peer.json")))
    except Exception as e: peer = {"error": str(e)}
    w = done(os.path.join(r, f"{job}.worker.jsonl"))
    if "error" not in w:
        tokens = w["trainTokens"] - w["windowSize"]
        w["tps"] = tokens / (w["trainSeconds"] - w["firstStepSeconds"])
        w["tpc"] = tokens / (w["trainCpuSeconds"] - w["firstStepCpuSeconds"])
    for name, x, tps, tpc in (("bare PEFT", peer, peer.get("tokensPerSecond"), peer.get("tokensPerCpuSecond")),
                              ("Conduit torch worker", w, w.get("tps"), w.get("tpc"))):
        if "error" in x:
            print(f"| {job} | {name} | error: {x['error'][:120]} |"); continue
        ratio = tps / peer["tokensPerSecond"] if "error" not in peer and peer.get("tokensPerSecond") else float("nan")
        print(f"| {job} | {name} | {tps:.0f} | {tpc:.0f} | {ratio:.3f} | {x.get('firstStepSeconds', 0):.2f} s | "
              f"{x.get('peakGpuBytes', 0) / 2**20:.0f} MiB | {x.get('peakRssBytes', 0) / 2**20:.0f} MiB |")
d = done(os.path.join(r, "dates.worker.jsonl"))
print("dates:", json.dumps({k: d.get(k) for k in ("error", "steps", "finalTrainLoss", "tokensPerSecond", "device", "dtype", "peakGpuBytes")}))
PY
tar -cf "$OUT/torch.tar" -C "$R" .
log "done in $((SECONDS - T0))s"
cat "$SUMMARY"
