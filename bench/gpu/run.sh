#!/usr/bin/env bash
# bench/gpu/run.sh — issue #32 on a CUDA machine that has no Node.js: Conduit's generation against llama.cpp's
# llama-bench / llama-server (same source, same CUDA kernels), and the embedded trainer on the GPU.
#
#   bash bench/gpu/run.sh [unpack] [check] [gen] [train]     # no argument: all four, in that order
#
# Reads what bench/gpu/stage.sh put under .device/gen/ (carried to the device, in one or more folders):
#   .device/gen/*/rt.tar.xz      node, the runtime node_modules (node-llama-cpp with the sm_90 CUDA plugin), and
#                                the reference llama-bench / llama-server with their libraries
#   .device/gen/*/model.xz.NN    SmolLM2-135M-Instruct Q4_1, xz-compressed and split; joined in name order
#   .device/gen/*/MANIFEST       sha256 of every file above and of the model (checked at unpack)
# and nothing outside the repository but the CUDA runtime libraries (libcudart.so.13, libcublas.so.13,
# libcublasLt.so.13) of the machine's python3 (its `nvidia` packages; /usr/local/cuda as a fallback) and the
# driver's libcuda.so.1.
#
# Phases:
#   unpack  node_modules/ (refused if the repo already has one not made here), .device/rt/{bin/node,ref/},
#           .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf (when every model part is there). Idempotent.
#   check   nvidia-smi, the CUDA libraries found, the backend node-llama-cpp and the trainer's libllama get
#           (bench/gpu/check.ts), the devices the reference tools see. Needs no model.
#   gen     llama-bench (pp512, tg128, -ngl 99) alone, then bench/serve.ts --gpu (Conduit `/v1/completions`
#           against llama-server -np 8, one stream and 8 streams, interleaved rounds).
#   train   bench/lora.ts --gpu: LoRA r16 on a Q8_0 base (the default) and an F32 base, 256-token windows; tokens/s,
#           peak GPU memory, the ops the trainer leaves to the CPU; then 2 steps of Q8_0 with GGML_SCHED_DEBUG=2
#           (sched.txt: every node's backend; the summary counts the training graph's nodes per backend).
#
# Environment: OUT (results, default .cache/gpu-out), GPU (cuda; `off` for the CPU rehearsal), TRAIN_GPU (the
# trainer's backend, default $GPU), THREADS (generation threads, 1), TRAIN_THREADS (min(8, cores)),
# RUNS (serve.ts rounds, 5), TOKENS (128), STEPS (trainer steps on an F32 base, 40), STEPS_QUANT (on a quantized
# base, 20), BASES (Q8_0,F32), BUDGET (seconds after which no step runs on, 330: the script ends by ~6 min).
# Writes to $OUT at most 6 files: log.txt bench.json serve.json train.json sched.txt summary.txt (bench/gpu/torch.sh
# adds 2: the device tool brings back 8), and prints the summary last. Every step runs under `timeout`.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
T0=$SECONDS
OUT="${OUT:-$ROOT/.cache/gpu-out}"
mkdir -p "$OUT"
GEN="$ROOT/.device/gen"
RT="$ROOT/.device/rt"
GPU="${GPU:-cuda}"
TRAIN_GPU="${TRAIN_GPU:-$GPU}"
[ "$TRAIN_GPU" = off ] && TRAIN_GPU=cpu
THREADS="${THREADS:-1}"
NPROC="$(nproc)"
TRAIN_THREADS="${TRAIN_THREADS:-$((NPROC < 8 ? NPROC : 8))}"
RUNS="${RUNS:-5}"
TOKENS="${TOKENS:-128}"
STEPS="${STEPS:-40}"
STEPS_QUANT="${STEPS_QUANT:-20}"
BASES="${BASES:-Q8_0,F32}"
BUDGET="${BUDGET:-330}"
MODEL="$ROOT/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
LOG="$OUT/log.txt"
SUMMARY="$OUT/summary.txt"
PHASES="${*:-unpack check gen train}"
NODE="$RT/bin/node"
export PATH="$RT/bin:$PATH"
export CONDUIT_BENCH_LLAMA_BIN="$RT/ref"

log() { printf '[gpu %4ds] %s\n' "$((SECONDS - T0))" "$*" | tee -a "$LOG"; }
note() { printf '%s\n' "$*" >> "$SUMMARY"; }
# step NAME SECONDS CMD...: runs CMD under timeout, its output into the log (and on the console); never aborts.
# No step runs past BUDGET seconds from the start: its limit is cut to what is left, and with under 15 s left it
# is skipped.
step() {
  local name=$1 limit=$2; shift 2
  local left=$((BUDGET - (SECONDS - T0)))
  if [ "$left" -lt 15 ]; then log "── $name: skipped (BUDGET ${BUDGET}s spent)"; note "SKIPPED: $name (BUDGET)"; return 1; fi
  [ "$limit" -le "$left" ] || limit=$left
  log "── $name (timeout ${limit}s): $*"
  local t=$SECONDS
  timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  log "── $name: rc=$rc in $((SECONDS - t))s"
  [ "$rc" = 0 ] || note "FAILED: $name (rc=$rc$([ "$rc" = 124 ] && echo ', timed out'))"
  return "$rc"
}

# ---------------------------------------------------------------------------------------------------------
# The CUDA runtime: libcudart/libcublas/libcublasLt 13 from python3's nvidia packages (PyTorch's), else from a
# CUDA toolkit; the driver's libcuda.so.1 from the loader's cache or the usual driver folders.
# ---------------------------------------------------------------------------------------------------------
cuda_paths() {
  local dirs=""
  if command -v python3 >/dev/null; then
    dirs="$(timeout 60 python3 - <<'PY' 2>/dev/null
import glob, os
roots = []
try:
    import nvidia
    roots += list(nvidia.__path__)
except Exception:
    pass
found = []
for root in roots:
    for name in ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13"):
        for f in sorted(glob.glob(os.path.join(root, "**", name), recursive=True)):
            d = os.path.dirname(os.path.realpath(f))
            if d not in found:
                found.append(d)
print(":".join(found))
PY
)"
  fi
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64; do
    [ -e "$d/libcublas.so.13" ] && dirs="${dirs:+$dirs:}$d"
  done
  if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
    for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
      [ -e "$d/libcuda.so.1" ] && dirs="${dirs:+$dirs:}$d"
    done
  fi
  printf '%s' "$dirs"
}
if [ "$GPU" != off ] || [ "$TRAIN_GPU" != cpu ]; then
  CUDA_DIRS="$(cuda_paths)"
  export LD_LIBRARY_PATH="${CUDA_DIRS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# xz -dc, or Python's lzma where there is no xz
unxz() {
  if command -v xz >/dev/null; then xz -dc
  else python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)'; fi
}

# ---------------------------------------------------------------------------------------------------------
unpack() {
  local manifest
  manifest="$(ls "$GEN"/*/MANIFEST 2>/dev/null | head -n 1)"
  [ -n "$manifest" ] || { log "no $GEN/*/MANIFEST: nothing staged here"; note "FAILED: unpack (nothing staged)"; return 1; }
  log "staged: $(cd "$GEN" && ls -l */* | awk '{printf "%s %d; ", $NF, $5}')"
  # Check what is here against the manifest (a part missing is not an error until it is needed).
  local bad=0 f sum want
  while read -r want f; do
    local p; p="$(ls "$GEN"/*/"$f" 2>/dev/null | head -n 1)"
    [ -n "$p" ] || continue
    sum="$(sha256sum "$p" | cut -d' ' -f1)"
    [ "$sum" = "$want" ] || { log "CORRUPT: $p (sha256 $sum, want $want)"; bad=1; }
  done < <(grep -v '^model ' "$manifest")
  [ "$bad" = 0 ] || { note "FAILED: unpack (corrupt transfer)"; return 1; }

  local rt; rt="$(ls "$GEN"/*/rt.tar.xz 2>/dev/null | head -n 1)"
  local stamp="$RT/.stamp"
  if [ -n "$rt" ] && [ "$(cat "$stamp" 2>/dev/null)" != "$(grep ' rt.tar.xz$' "$manifest")" ]; then
    if [ -d node_modules ] && [ ! -f node_modules/.conduit-gpu-rt ]; then
      log "refusing to unpack over an existing node_modules (not one this script made)"
      note "FAILED: unpack (node_modules exists)"; return 1
    fi
    rm -rf node_modules "$RT"
    log "unpacking $rt"
    unxz < "$rt" | tar -C "$ROOT" -xf - || { note "FAILED: unpack rt.tar.xz"; return 1; }
    grep ' rt.tar.xz$' "$manifest" > "$stamp"
  fi
  [ -x "$NODE" ] && log "node $("$NODE" --version)"

  local parts; parts="$(ls "$GEN"/*/model.xz.* 2>/dev/null | awk -F/ '{print $NF" "$0}' | sort | cut -d' ' -f2-)"
  local want_parts; want_parts="$(grep -c ' model\.xz\.' "$manifest")"
  local want_model; want_model="$(awk '$1=="model"{print $2}' "$manifest")"
  if [ -f "$MODEL" ] && [ "$(cat "$MODEL.sha256" 2>/dev/null)" = "$want_model" ]; then
    log "model already unpacked"
  elif [ "$(printf '%s\n' $parts | grep -c .)" = "$want_parts" ]; then
    mkdir -p "$(dirname "$MODEL")"
    log "joining $want_parts model parts"
    # shellcheck disable=SC2086
    cat $parts | unxz > "$MODEL.tmp" || { note "FAILED: unpack model"; return 1; }
    local got; got="$(sha256sum "$MODEL.tmp" | cut -d' ' -f1)"
    [ "$got" = "$want_model" ] || { log "model sha256 $got, want $want_model"; note "FAILED: unpack model (sha256)"; return 1; }
    mv "$MODEL.tmp" "$MODEL"; echo "$got" > "$MODEL.sha256"
    log "model $(stat -c %s "$MODEL") bytes, sha256 ok"
  else
    log "model: $(printf '%s\n' $parts | grep -c .) of $want_parts parts here (later call)"
  fi
}

# ---------------------------------------------------------------------------------------------------------
check() {
  {
    echo "date: $(date -u +%FT%TZ)"; echo "uname: $(uname -srm)"; echo "cores: $NPROC"
    grep -m1 'model name' /proc/cpuinfo; head -n 2 /etc/os-release 2>/dev/null; ldd --version 2>&1 | head -n 1
    echo "GPU=$GPU TRAIN_GPU=$TRAIN_GPU THREADS=$THREADS TRAIN_THREADS=$TRAIN_THREADS RUNS=$RUNS TOKENS=$TOKENS STEPS=$STEPS/$STEPS_QUANT"
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    timeout 20 nvidia-smi 2>&1 || echo "(no nvidia-smi)"
    timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || true
    command -v python3 >/dev/null && timeout 60 python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' 2>&1
    for l in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcuda.so.1; do
      printf '%s -> ' "$l"; for d in ${LD_LIBRARY_PATH//:/ }; do [ -e "$d/$l" ] && { printf '%s' "$(readlink -f "$d/$l")"; break; }; done; echo
    done
    echo "ref plugin: $(ls "$RT/ref" 2>/dev/null | tr '\n' ' ')"
    echo "ldd libggml-cuda.so (reference):"; ldd "$RT/ref/libggml-cuda.so" 2>&1 | grep -E 'cu|not found'
  } >> "$LOG" 2>&1
  note "device: $( (timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo none) | head -n 1); $NPROC cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  step "engine backend" 60 "$NODE" --import tsx bench/gpu/check.ts engine "$GPU" && note "engine: $(grep '^engine:' "$LOG" | tail -n 1)"
  step "trainer backend" 60 "$NODE" --import tsx bench/gpu/check.ts trainer "$TRAIN_GPU" && note "trainer: $(grep '^trainer:' "$LOG" | tail -n 1)"
  step "reference devices" 30 "$RT/ref/llama-server" --list-devices
}

# ---------------------------------------------------------------------------------------------------------
gen() {
  [ -f "$MODEL" ] || { note "FAILED: gen (no model)"; return 1; }
  local ngl=99; [ "$GPU" = off ] && ngl=0
  log "── llama-bench (timeout 90s): pp512, tg$TOKENS, -t $THREADS -ngl $ngl -r 5"
  local t=$SECONDS
  timeout -k 10 90 "$RT/ref/llama-bench" -m "$MODEL" -t "$THREADS" -ngl "$ngl" -p 512 -n "$TOKENS" -r 5 -o json \
    > "$OUT/bench.json" 2>> "$LOG"
  local rc=$?
  log "── llama-bench: rc=$rc in $((SECONDS - t))s"
  [ "$rc" = 0 ] || note "FAILED: llama-bench (rc=$rc)"
  "$NODE" -e '
    const rows = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    for (const r of rows) console.log(`llama-bench ${r.n_prompt ? "pp" + r.n_prompt : "tg" + r.n_gen}: ${r.avg_ts.toFixed(1)} ± ${r.stddev_ts.toFixed(1)} tok/s (${r.backends}, ngl ${r.n_gpu_layers}, ${r.gpu_info || r.cpu_info})`);
  ' "$OUT/bench.json" 2>/dev/null | tee -a "$LOG" >> "$SUMMARY"
  step "serve.ts" 180 "$NODE" --import tsx bench/serve.ts "$MODEL" --gpu "$GPU" --threads "$THREADS" \
    --tokens "$TOKENS" --runs "$RUNS" --json "$OUT/serve.json"
  [ -f "$OUT/serve.json" ] && "$NODE" -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    const f = (x) => (x >= 100 ? x.toFixed(0) : x.toFixed(2));
    console.log(`serve.ts --gpu ${r.gpu}: conduit on ${JSON.stringify(r.accelerator)}; ${r.runs} rounds, ${r.tokens} tokens`);
    const rows = [
      ["single stream, not streamed / llama-bench tg (tok/s)", r.singlePlainVsBench],
      ["single stream, streamed / llama-bench tg (tok/s)", r.singleStreamedVsBench],
      ["single stream, streamed / llama-server (tok/s)", r.singleStreamedVsServer],
      ["8 streams / llama-server -np 8 (tok/s)", r.streams8VsServer],
      ["8 streams, CPU ms per token", r.streams8CpuMsPerToken],
      ["time to first token (ms)", r.ttftMs],
      ["TTFT new long prompt (ms)", r.ttftNewPromptMs],
      ["TTFT shared prefix (ms)", r.ttftSharedPrefixMs],
    ];
    for (const [name, p] of rows) if (p) console.log(`  ${name.padEnd(54)} ${f(p.conduit).padStart(8)} ${f(p.reference).padStart(8)}  ${p.ratio.toFixed(2)}x`);
  ' "$OUT/serve.json" | tee -a "$LOG" >> "$SUMMARY"
}

# ---------------------------------------------------------------------------------------------------------
train() {
  [ -f "$MODEL" ] || { note "FAILED: train (no model)"; return 1; }
  rm -f "$OUT/train.json"
  local base steps
  for base in ${BASES//,/ }; do
    # A quantized base's backward pass partly runs on the CPU (OUT_PROD): fewer steps, so it cannot eat the call.
    steps=$STEPS; [ "$base" = F32 ] || steps=$STEPS_QUANT
    step "lora.ts $base" 150 "$NODE" --import tsx bench/lora.ts "$MODEL" --gpu "$TRAIN_GPU" --methods lora --bases "$base" \
      --steps "$steps" --kb "$((steps * 3 / 2 + 4))" --ctx 256 --threads "$TRAIN_THREADS" --json "$OUT/train.json"
  done
  [ -f "$OUT/train.json" ] && "$NODE" -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    console.log(`lora.ts --gpu ${r.gpu}: ${r.threads} threads, ${r.ctx}-token windows, rank ${r.rank}`);
    for (const [name, m] of Object.entries(r.results)) {
      console.log(`  ${name.padEnd(12)} ${m.tokensPerSecond.toFixed(0).padStart(7)} tok/s  ${m.steps} steps  peak GPU ${m.peakGpuMb === undefined ? "n/a" : m.peakGpuMb.toFixed(0) + " MiB"}  peak RSS ${m.peakRssMb.toFixed(0)} MiB`);
      for (const line of m.deviceLog.filter((l) => /cannot run|registered no GPU/.test(l))) console.log(`    ${line}`);
    }
  ' "$OUT/train.json" | tee -a "$LOG" >> "$SUMMARY"
  # The scheduler's own account of a step (GGML_SCHED_DEBUG=2: every node of every graph with the backend it runs
  # on): of the largest graph (the training step's), the nodes per backend and the ops left on the CPU.
  rm -f "$OUT/sched.raw"
  step "sched debug" 90 env GGML_SCHED_DEBUG=2 "$NODE" --import tsx bench/lora.ts "$MODEL" --gpu "$TRAIN_GPU" --methods lora \
    --bases "${BASES%%,*}" --steps 2 --kb 4 --ctx 256 --threads "$TRAIN_THREADS" --native-log "$OUT/sched.raw" > /dev/null
  if [ -f "$OUT/sched.raw" ]; then
    head -c 15000000 "$OUT/sched.raw" > "$OUT/sched.txt"; rm -f "$OUT/sched.raw"
    "$NODE" -e '
      const lines = require("fs").readFileSync(process.argv[1], "utf8").split("\n");
      const graphs = [];
      for (const line of lines) {
        const m = /^node #\s*(\d+) \(\s*([^)]*?)\):\s+.*? \(\s*[^)]*\) \[\s*(\S+)/.exec(line);
        if (!m) continue;
        const i = Number(m[1]);
        if (graphs.length === 0 || i <= graphs.at(-1).last) graphs.push([]);
        graphs.at(-1).last = i;
        graphs.at(-1).push({ op: m[2].trim(), backend: m[3] });
      }
      if (graphs.length === 0) graphs.push([]);
      const g = graphs.reduce((a, b) => (b.length > a.length ? b : a));
      const count = (xs) => [...xs.reduce((m, x) => m.set(x, (m.get(x) ?? 0) + 1), new Map())].sort((a, b) => b[1] - a[1]);
      console.log(`sched debug (${process.argv[2]} base): ${graphs.length} graphs; the largest, ${g.length} nodes, by backend: ` +
        count(g.map((n) => n.backend)).map(([b, n]) => `${b} ${n}`).join(", "));
      const cpu = g.filter((n) => n.backend.startsWith("CPU"));
      if (cpu.length > 0 && cpu.length < g.length) console.log(`  its ops on the CPU: ` + count(cpu.map((n) => n.op)).map(([o, n]) => `${o} ${n}`).join(", "));
    ' "$OUT/sched.txt" "${BASES%%,*}" | tee -a "$LOG" >> "$SUMMARY"
  fi
}

: > "$SUMMARY"
log "phases: $PHASES (GPU=$GPU, TRAIN_GPU=$TRAIN_GPU, OUT=$OUT)"
for phase in $PHASES; do
  case "$phase" in
    unpack) unpack ;;
    check) check ;;
    gen) gen ;;
    train) train ;;
    *) log "unknown phase $phase" ;;
  esac
done
note "total $((SECONDS - T0)) s"
echo
echo "================ summary (bench/gpu/run.sh: $PHASES) ================"
cat "$SUMMARY"
