#!/usr/bin/env bash
# Prepare benchmarks/gpu.sh for a GPU machine that reaches no package index or model hub (run here, where pip works):
#   .whl/          wheels of the pure-Python packages specprim needs beyond a CUDA PyTorch image (transformers and
#                  its hub client at the versions installed here, gguf) and of pytest (gpu.sh runs
#                  `pytest -m cuda tests/test_gpu_kernel.py`), for Python 3.12
#   .gpu/smollm2   SmolLM2-135M-Instruct's config and tokenizer (no weights: they exceed what such a machine takes)
# Both are ignored by git (.git/info/exclude); carry them with the working tree and run `bash benchmarks/gpu.sh`.
#
#   bash benchmarks/gpu_prepare.sh [PYTHON_VERSION]     # default 3.12, the GPU image's Python
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER="${1:-3.12}"
EXCLUDE="$(git rev-parse --git-dir)/info/exclude"
mkdir -p "$(dirname "$EXCLUDE")"
for path in /.whl/ /.gpu/; do grep -qxF "$path" "$EXCLUDE" 2>/dev/null || echo "$path" >> "$EXCLUDE"; done

version() { python -m pip show "$1" 2>/dev/null | awk '/^Version:/{print $2}'; }
PACKAGES=()
for name in transformers huggingface_hub httpx2 httpcore2 truststore kernels tomlkit click gguf \
    pytest pluggy iniconfig pygments packaging; do
    v="$(version "$name")"
    [ -n "$v" ] && PACKAGES+=("$name==$v")
done
rm -rf .whl && mkdir -p .whl
python -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${PACKAGES[@]}"
python - <<'PY'
from specprim import models

models.load_config("smollm2-135m-instruct").save_pretrained(".gpu/smollm2")
models.load_tokenizer("smollm2-135m-instruct").save_pretrained(".gpu/smollm2")
PY
du -sh .whl .gpu
