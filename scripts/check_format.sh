#!/usr/bin/env bash
# Fails when a C++ source differs from what clang-format 14 makes of it with the repo's style, or
# when a Catch2 test name holds a ';' (ctest splits such a name into several entries that fail) or
# a backslash (Catch reads it as an escape in the test spec ctest passes: no test matches).
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
if git grep -n -E 'TEST_CASE\("[^"]*;' -- tests >/dev/null; then
  git grep -n -E 'TEST_CASE\("[^"]*;' -- tests | sed 's/^/format: a test name with ";" (ctest splits it): /'
  bad=1
fi
if git grep -n -E 'TEST_CASE\("[^"]*\\' -- tests >/dev/null; then
  git grep -n -E 'TEST_CASE\("[^"]*\\' -- tests |
    sed 's/^/format: a test name with a backslash (no ctest filter matches it): /'
  bad=1
fi
[ $bad -eq 0 ] && echo "format: OK ($(echo "$files" | wc -w) files)"
exit $bad
