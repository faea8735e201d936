#!/usr/bin/env bash
# Formats the C sources with clang-format (.clang-format); --check only reports files that differ.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files 'src/*.c' 'src/*.h' 'tests/unit/*.c' 'tests/unit/*.h' 'bench/*.c')
if [ "${1:-}" = "--check" ]; then
    bad=$(clang-format --dry-run "${files[@]}" 2>&1 | grep -oE '^[^:]+:[0-9]+:[0-9]+: warning' | cut -d: -f1 | sort -u || true)
    if [ -n "$bad" ]; then
        echo "not clang-formatted (run tools/format.sh):"
        echo "$bad"
        exit 1
    fi
    echo "format: ${#files[@]} files clean"
else
    clang-format -i "${files[@]}"
fi
