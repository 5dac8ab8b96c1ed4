#!/usr/bin/env bash
# bench/lib/referenceBench.sh — raw llama.cpp reference numbers (run bench/setup.sh first).
#
#   bash bench/lib/referenceBench.sh            # everything, 1 and 2 threads
#   THREADS="1" ONLY=gen bash bench/lib/referenceBench.sh
#
# ONLY=gen|prompt|train limits the run; THREADS (default "1 2"); REPS (llama-bench -r, default 5);
# FT_CTX (finetune -c/-b/-ub, default 256); FT_KB (corpus size in KiB, default 160).
# Raw logs go to .cache/bench/reference/<UTC timestamp>/; a markdown summary is printed
# and written to summary.md there.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="$ROOT/.cache/llama.cpp/build/bin"
MODELS="$ROOT/.cache/models"
THREADS="${THREADS:-1 2}"
REPS="${REPS:-5}"
FT_CTX="${FT_CTX:-256}"
FT_KB="${FT_KB:-160}"
ONLY="${ONLY:-}"
OUT="$ROOT/.cache/bench/reference/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$OUT"

say() { printf '[reference] %s\n' "$*" >&2; }
for b in llama-bench llama-finetune; do
  [ -x "$BIN/$b" ] || { say "missing $BIN/$b — run bench/setup.sh"; exit 1; }
done

MODEL_LIST=()
[ -e "$MODELS/stories260Ktok512.gguf" ] && MODEL_LIST+=("$MODELS/stories260Ktok512.gguf")
[ -e "$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf" ] && MODEL_LIST+=("$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf")

{
  echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -n1); date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "llama.cpp: $(git -C "$ROOT/.cache/llama.cpp/src" rev-parse --short HEAD 2>/dev/null) (node-llama-cpp bundle), static CPU build, GGML_NATIVE=ON, GGML_OPENMP=OFF"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
} | tee "$OUT/summary.md" >&2

# llama-bench: one row per (model, threads, test). -o jsonl gives avg_ts / stddev_ts.
bench() { # $1 model, $2 threads, $3 kind (gen|prompt)
  local m="$1" t="$2" kind="$3" args
  if [ "$kind" = gen ]; then args=(-p 0 -n 200); else args=(-p 128 -n 0); fi
  local log="$OUT/bench-$(basename "$m" .gguf)-t$t-$kind.jsonl"
  say "llama-bench -m $(basename "$m") -t $t ${args[*]} -r $REPS"
  "$BIN/llama-bench" -m "$m" -t "$t" "${args[@]}" -r "$REPS" -o jsonl > "$log" 2> "$log.stderr"
  python3 - "$log" "$(basename "$m" .gguf)" "$t" "$kind" <<'EOF'
import json, sys
path, model, t, kind = sys.argv[1:]
for line in open(path):
    line = line.strip()
    if not line.startswith('{'): continue
    r = json.loads(line)
    test = f"pp{r['n_prompt']}" if r['n_prompt'] else f"tg{r['n_gen']}"
    ts = sorted(r.get('samples_ts') or [r['avg_ts']])
    med = ts[len(ts) // 2] if len(ts) % 2 else (ts[len(ts) // 2 - 1] + ts[len(ts) // 2]) / 2
    print(f"| {model} | {r.get('model_type','?')} | {t} | {test} | {r['avg_ts']:.1f} ± {r['stddev_ts']:.1f} | {med:.1f} | {ts[-1]:.1f} |")
EOF
}

if [ -z "$ONLY" ] || [ "$ONLY" = gen ] || [ "$ONLY" = prompt ]; then
  {
    echo "| model | type | threads | test | tokens/s mean ± sd ($REPS reps) | median | best |"
    echo "|---|---|---|---|---|---|---|"
  } | tee -a "$OUT/summary.md"
  for m in "${MODEL_LIST[@]}"; do
    for kind in gen prompt; do
      [ -n "$ONLY" ] && [ "$ONLY" != "$kind" ] && continue
      for t in $THREADS; do bench "$m" "$t" "$kind" | tee -a "$OUT/summary.md"; done
    done
  done
  echo | tee -a "$OUT/summary.md"
fi

# Deterministic TinyStories-like corpus (bash RANDOM with a fixed seed).
make_corpus() { # $1 = file, $2 = KiB
  local f="$1" kib="$2"
  local names=(Lily Tom Sam Mia Ben Anna Max Sue)
  local things=("a red ball" "a little dog" "a big tree" "a shiny box" "a blue kite" "a small cat" "a warm cake" "a green frog")
  local verbs=(found saw liked wanted shared lost painted hugged)
  local ends=("They were very happy." "It was a fun day." "Mom smiled at them." "They played all day." "Then they went home." "Everyone laughed.")
  RANDOM=42
  : > "$f"
  while [ "$(stat -c %s "$f")" -lt $((kib * 1024)) ]; do
    local s="" i
    for i in 1 2 3 4 5 6 7 8; do
      local a=${names[RANDOM % 8]} b=${names[RANDOM % 8]} x=${things[RANDOM % 8]} v=${verbs[RANDOM % 8]} e=${ends[RANDOM % 6]}
      s+="Once upon a time, $a $v $x. $a showed it to $b. $b said, \"I like it!\" $e "
    done
    printf '%s\n\n' "$s" >> "$f"
  done
}

if [ -z "$ONLY" ] || [ "$ONLY" = train ]; then
  st="$MODELS/stories260Ktok512.gguf"
  if [ ! -e "$st" ]; then
    say "no stories260K model — skipping finetune"
  else
    corpus="$OUT/corpus.txt"
    make_corpus "$corpus" "$FT_KB"
    say "corpus: $corpus ($(stat -c %s "$corpus") bytes)"
    {
      echo "| llama-finetune stories260K | threads | -c | datapoints train/val | train tokens | train time (s) | train tokens/s | wall (s) | peak RSS (MiB) |"
      echo "|---|---|---|---|---|---|---|---|---|"
    } | tee -a "$OUT/summary.md"
    for t in $THREADS; do
      log="$OUT/finetune-t$t.log"
      say "llama-finetune -m $(basename "$st") -f corpus.txt -c $FT_CTX -b $FT_CTX -ub $FT_CTX -epochs 1 -t $t"
      # timestamp every '\r'/'\n'-terminated progress chunk so training time is not limited to
      # the progress bar's whole seconds
      python3 - "$log" "$t" "$FT_CTX" "/usr/bin/time" -v -o "$OUT/finetune-t$t.time" \
        "$BIN/llama-finetune" -m "$st" -f "$corpus" -c "$FT_CTX" -b "$FT_CTX" -ub "$FT_CTX" \
        -epochs 1 -t "$t" -o "$OUT/finetuned-t$t.gguf" <<'EOF' | tee -a "$OUT/summary.md"
import re, subprocess, sys, time
log, t, ctx, *cmd = sys.argv[1:]
p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
t0 = time.monotonic(); first = last = None; ntrain = nval = 0; buf = b""
with open(log, "wb") as f:
    while True:
        ch = p.stderr.read1(4096)
        if not ch: break
        f.write(ch); buf += ch; now = time.monotonic()
        parts = re.split(rb"[\r\n]", buf); buf = parts.pop()
        for line in parts:
            m = re.search(rb"^(train|val):.*data=(\d+)/(\d+)", line)
            if not m: continue
            if m.group(1) == b"train":
                if first is None: first = now  # first batch finished
                last = now; ntrain = int(m.group(3))
            else:
                nval = int(m.group(3))
rc = p.wait(); wall = time.monotonic() - t0
ctx = int(ctx)
# the first progress line appears after batch 1; time batches 2..N for the rate
dt = (last - first) if first and last and last > first else float("nan")
rate = (ntrain - 1) * ctx / dt if dt == dt and ntrain > 1 else float("nan")
try:
    timef = open(cmd[cmd.index("-o") + 1]).read()
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", timef).group(1)) / 1024
except Exception:
    rss = float("nan")
print(f"| stories260K{'' if rc == 0 else f' (exit {rc})'} | {t} | {ctx} | {ntrain}/{nval} | {ntrain*ctx} | {dt:.2f} (batches 2..{ntrain}) | {rate:.0f} | {wall:.2f} | {rss:.0f} |")
EOF
    done
  fi
fi
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/summary.md" >&2
say "logs and summary: $OUT"
