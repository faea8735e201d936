#!/usr/bin/env bash
# Builds sluice and runs the whole test suite (unit tests, fixture logits, CLI tests).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
# SLUICE_CUDA_ARCHS=80 (say) compiles the CUDA kernels for one architecture instead of the fat default
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release ${SLUICE_CUDA_ARCHS:+-DCMAKE_CUDA_ARCHITECTURES=$SLUICE_CUDA_ARCHS} >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
cd "$BUILD" && ctest --output-on-failure -j"$(nproc)"
