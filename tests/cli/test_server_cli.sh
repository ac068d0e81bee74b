#!/usr/bin/env bash
# llm-server's command-line conventions, run on the binary: --help, --help-all and --version exit
# 0 on stdout; unknown flags, bad values and options that cannot apply exit 2 naming the flag on
# stderr, before any model is loaded.
# usage: test_server_cli.sh LLM_SERVER_BINARY PROJECT_VERSION
set -u
server=$1
version=$2
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
failures=0

# expect CODE STREAM TEXT -- ARGS...: exit status CODE, and TEXT (fixed string) in STREAM.
expect() {
  local code=$1 stream=$2 text=$3
  shift 4
  "$server" "$@" >"$out" 2>"$err"
  local rc=$?
  local file=$out
  [ "$stream" = stderr ] && file=$err
  if [ "$rc" -ne "$code" ] || ! grep -qF -- "$text" "$file"; then
    echo "FAIL: llm-server $* -> exit $rc (want $code), $stream lacks '$text'"
    sed 's/^/  stdout: /' "$out" | head -5
    sed 's/^/  stderr: /' "$err" | head -5
    failures=$((failures + 1))
  else
    echo "ok: llm-server $* -> $rc"
  fi
}

expect 0 stdout "usage: llm-server" -- --help
expect 0 stdout "--max-num-seqs INT" -- -h
expect 0 stdout "--mla-kernel" -- --help-all
expect 0 stdout "llm-server $version" -- --version
expect 2 stderr "unknown flag --bogus" -- --bogus
expect 2 stderr "unknown flag --bogus" -- --model-dir /nonexistent --bogus 1
expect 2 stderr "--max-num-seqs must be in" -- --model-dir /nonexistent --max-num-seqs 0
expect 2 stderr "--block-size must be an integer" -- --model-dir /nonexistent --block-size x
expect 2 stderr "model_dir is required" --
expect 2 stderr "--dummy-weights does not apply to device cpu" -- \
  --model-dir /nonexistent --device cpu --dummy-weights true
expect 2 stderr "/nonexistent/server.json" -- --config /nonexistent/server.json
# --help wins over errors elsewhere on the line, and prints no options of the kernel group.
expect 0 stdout "usage: llm-server" -- --bogus --help
"$server" --help | grep -qF -- "--mla-kernel" && {
  echo "FAIL: --help lists the kernel experiment --mla-kernel (only --help-all should)"
  failures=$((failures + 1))
}
[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all passed"
