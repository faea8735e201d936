#!/usr/bin/env bash
# Makes the GGUF fixtures of the family checkpoints (tools/make_gguf_families.py) on a machine with python3,
# torch, numpy, safetensors, transformers 5.x, pyyaml and tqdm, a llama.cpp source tree and a built
# llama-quantize. The fixtures land in OUTDIR/tests/fixtures/gguf/<fixture>-<TYPE>/ (copy OUTDIR/tests over
# the repository's), the log of everything in OUTDIR/gguf-families.log, the converter's and llama-quantize's
# own logs in OUTDIR/logs/<fixture>/. Exits nonzero when a fixture failed (the summary at the end says which).
#
#   tools/gguf-families.sh LLAMA_CPP_SRC LLAMA_QUANTIZE_BIN OUTDIR [FIXTURE ...]
#
# FIXTURE: folders of tests/fixtures/families (default: all). MAKE_GGUF_ARGS: more options for the script,
# e.g. MAKE_GGUF_ARGS="--types Q8_0" or "--fp8-outtype bf16" or "--device cuda".
set -uo pipefail
if [ $# -lt 3 ]; then
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
SRC=$(cd "$1" && pwd) || exit 2
QUANTIZE=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
mkdir -p "$3" || exit 2
OUT=$(cd "$3" && pwd)
shift 3
cd "$(dirname "$0")/.." || exit 2
mkdir -p "$OUT/tests/fixtures/gguf" "$OUT/logs"
LOG=$OUT/gguf-families.log
{
    echo "== $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname), repository $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)')"
    echo "== llama.cpp: $SRC; llama-quantize: $QUANTIZE"
    python3 --version
    python3 -c 'import numpy, safetensors, torch, transformers
print("numpy", numpy.__version__, "safetensors", safetensors.__version__, "torch", torch.__version__,
      "transformers", transformers.__version__)' || exit 1
    echo "== plan"
    # shellcheck disable=SC2086 # MAKE_GGUF_ARGS is a list of options
    python3 tools/make_gguf_families.py --dry-run --llama-cpp "$SRC" --quantize "$QUANTIZE" ${MAKE_GGUF_ARGS:-} "$@" ||
        exit 1
    echo "== run"
    # shellcheck disable=SC2086
    python3 tools/make_gguf_families.py --llama-cpp "$SRC" --quantize "$QUANTIZE" --out "$OUT/tests/fixtures/gguf" \
        --logs "$OUT/logs" ${MAKE_GGUF_ARGS:-} "$@"
    rc=$?
    echo "== written"
    du -sh "$OUT"/tests/fixtures/gguf/*/ 2>/dev/null
    exit $rc
} 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
