#!/usr/bin/env bash
# Fails when a C++ source differs from what clang-format 14 makes of it with the repo's style.
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' '*.hpp')
bad=0
for f in $files; do
  if ! clang-format-14 --dry-run --Werror "$f" >/dev/null 2>&1; then
    echo "format: $f differs from clang-format-14 (run: clang-format-14 -i $f)"
    bad=1
  fi
done
[ $bad -eq 0 ] && echo "format: OK ($(echo "$files" | wc -w) files)"
exit $bad
