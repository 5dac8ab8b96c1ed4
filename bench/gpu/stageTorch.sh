#!/usr/bin/env bash
# bench/gpu/stageTorch.sh — stages .device/train/ (git-ignored) for bench/gpu/torch.sh on a CUDA machine with
# Python and PyTorch but no Node.js (issue #32): the torch worker's jobs, prepared here by Conduit
# (tokenized with the served model's tokenizer, packed, planned), and what the machine lacks.
#
#   .device/train/smollm2/        300 windows of 256 tokens of SmolLM2-135M (text trained in full): speed
#   .device/train/tinyllama-1b/   100 windows of 512 tokens of a random model of TinyLlama's shape: speed
#   .device/train/dates/          the dates task of bench/quality.ts, 3 epochs, LoRA r4, with a probe: the adapter
#                                 comes back and bench/gpu/checkAdapter.ts serves it with llama.cpp here
#   .device/train/makeModel.mjs   bench/makeModel.ts bundled: writes the same 1B file there (same seed, same bytes)
#   .device/train/wheels/         gguf (transformers' GGUF loader needs it; the machine's image has no copy)
# The models are not carried: SmolLM2 comes with bench/gpu/stage.sh's parts, the 1B model is written there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
OUT=.device/train
STEPS_SMALL="${STEPS_SMALL:-300}"
STEPS_BIG="${STEPS_BIG:-100}"
rm -rf "$OUT"
mkdir -p "$OUT/wheels"
bench() { node --import tsx bench/trainTorch.ts "$@" --device auto 2>&1 | grep -E '^(wrote|trainer: [0-9])' ; }
bench smollm2-135m --export "$OUT/smollm2" --steps "$STEPS_SMALL" --ctx 256
bench tinyllama-1b --export "$OUT/tinyllama-1b" --steps "$STEPS_BIG" --ctx 512
bench smollm2-135m --export "$OUT/dates" --task dates --epochs 3 --rank 4
npx --no esbuild bench/makeModel.ts --bundle --platform=node --format=esm --outfile="$OUT/makeModel.mjs" --log-level=warning
python3 -m pip download -q --no-deps --only-binary=:all: -d "$OUT/wheels" "gguf==$(sed -n 's/^gguf==//p' src/train/torch/requirements.txt)"
du -sh "$OUT"; find "$OUT" -type f | sort | xargs ls -la | awk '{print $5, $9}'
