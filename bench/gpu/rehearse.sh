#!/usr/bin/env bash
# bench/gpu/rehearse.sh — bench/gpu/run.sh end to end on this machine's CPU, from what the device would get: a
# copy of the repository as the device tool sends it (tracked and untracked-not-ignored files) with .device/gen/
# beside it, in a temp dir where this checkout's node_modules cannot be reached. The one addition is node-llama-cpp's
# CPU package (@node-llama-cpp/linux-x64), copied in after unpacking: without CUDA the engine can only run on it.
# The rest is what the device runs: the staged node, node_modules and reference tools (CUDA builds, whose CUDA
# plugin finds no driver here and leaves the CPU backend), generation with CONDUIT_GPU=off and -ngl 0, and the
# trainer asking for CUDA (it loads the staged CUDA package, finds no GPU and trains on its CPU backend).
#
#   bash bench/gpu/rehearse.sh            # RUNS=2 TOKENS=32 STEPS=4 STEPS_QUANT=3 unless set; KEEP=1 keeps the temp dir
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
[ -f "$ROOT/.device/gen/a/MANIFEST" ] || { echo "nothing staged: run bash bench/gpu/stage.sh" >&2; exit 1; }
TMP="$(mktemp -d /tmp/conduit-gpu-rehearsal.XXXXXX)"
[ -n "${KEEP:-}" ] || trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/repo/.device"
(cd "$ROOT" && git ls-files -co --exclude-standard -z | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
  xargs -0 cp --parents -t "$TMP/repo")
echo "[rehearse] repo copy at $TMP/repo ($(du -sm "$TMP/repo" | cut -f1) MiB), staged parts:" \
  "$(du -sm "$ROOT/.device/gen"/* | tr '\n\t' '  ')"
cd "$TMP/repo"
export OUT="$TMP/out"
run() { env -u NODE_PATH GPU=off TRAIN_GPU=cuda RUNS="${RUNS:-2}" TOKENS="${TOKENS:-32}" STEPS="${STEPS:-4}" \
  STEPS_QUANT="${STEPS_QUANT:-3}" bash bench/gpu/run.sh "$@"; }
# The device's three calls, one part more each time (what earlier calls unpacked stays, as on a warm machine).
mkdir -p .device/gen
echo "[rehearse] call 1: part a"
cp -al "$ROOT/.device/gen/a" .device/gen/a
run unpack
cp -a "$ROOT/node_modules/@node-llama-cpp/linux-x64" node_modules/@node-llama-cpp/
run check
echo "[rehearse] call 2: part b"
cp -al "$ROOT/.device/gen/b" .device/gen/b
run unpack
echo "[rehearse] call 3: part c"
cp -al "$ROOT/.device/gen/c" .device/gen/c
run
echo "[rehearse] files in \$OUT: $(cd "$OUT" && ls -l | awk 'NR>1{printf "%s %s  ", $NF, $5}')"
