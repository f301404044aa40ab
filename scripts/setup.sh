#!/usr/bin/env bash
# One-shot set-up on a fresh machine: a virtual environment in .venv with tcsm installed (editable).
#   ./scripts/setup.sh          tcsm with the extras its commands use (tokenizers, TensorBoard, matplotlib)
#   ./scripts/setup.sh --test   every extra: the test suite also drives tiny random Hugging Face models and the
#                               offline reward scorers, so CI installs them all
# torch is installed first, pinned, so that no unpinned requirement pulls a multi-GB CUDA build.
# Set TORCH_INDEX_URL (e.g. https://download.pytorch.org/whl/cu124) to choose another torch build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="text,log"
case "${1:-}" in
  "") ;;
  --test) extras="all" ;;
  *) echo "usage: scripts/setup.sh [--test]" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3}
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install -q "torch==${TORCH_VERSION:-2.13.0}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
fi
.venv/bin/pip install -q -e ".[$extras]"
