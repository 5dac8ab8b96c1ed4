#!/usr/bin/env bash
# npm run setup:torch — makes the torch trainer's Python: a venv in .cache/torch-venv with the packages of
# src/train/torch/requirements.txt, from PyPI (and PyTorch's CPU index). Conduit finds it there by itself
# (CONDUIT_TRAINER=auto); CONDUIT_PYTHON points elsewhere. Safe to run again.
#
#   CONDUIT_TORCH_VARIANT=cpu   (default) PyTorch's CPU build: ~190 MB download, a ~1.2 GB venv
#   CONDUIT_TORCH_VARIANT=cuda  PyPI's default build with CUDA: ~3 GB download, a ~5.7 GB venv
#   PYTHON=python3.12           the Python the venv is made from (3.10 or newer)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.cache/torch-venv
REQUIREMENTS=src/train/torch/requirements.txt
VARIANT="${CONDUIT_TORCH_VARIANT:-cpu}"
TORCH_VERSION="$(sed -n 's/^torch==//p' "$REQUIREMENTS")"
say() { printf '[setup:torch] %s\n' "$*"; }

if [ ! -x "$VENV/bin/python" ]; then
  say "making $VENV with ${PYTHON:-python3}"
  "${PYTHON:-python3}" -m venv "$VENV"
fi
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }

case "$VARIANT" in
  cpu)
    if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__ != '$TORCH_VERSION+cpu')" 2>/dev/null; then
      say "installing PyTorch $TORCH_VERSION (CPU build)"
      # A local wheel or mirror that has the +cpu build answers first; else PyTorch's own CPU index.
      pip install -q "torch==$TORCH_VERSION+cpu" 2>/dev/null ||
        pip install -q "torch==$TORCH_VERSION+cpu" --extra-index-url https://download.pytorch.org/whl/cpu
    fi
    ;;
  cuda)
    say "installing PyTorch $TORCH_VERSION (PyPI's build, with CUDA)"
    pip install -q "torch==$TORCH_VERSION"
    ;;
  *)
    say "CONDUIT_TORCH_VARIANT must be cpu or cuda, got '$VARIANT'" >&2
    exit 2
    ;;
esac
say "installing $REQUIREMENTS"
pip install -q -r "$REQUIREMENTS"
say "checking: $VENV/bin/python src/train/torch/worker.py --probe"
"$VENV/bin/python" src/train/torch/worker.py --probe
say "done ($(du -sh "$VENV" | cut -f1)); Conduit uses it when CONDUIT_TRAINER is auto (the default) or torch"
