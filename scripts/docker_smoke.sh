#!/usr/bin/env bash
# The Dockerfile's build stage without a container engine: runs scripts/docker_build_stage.sh into
# a scratch prefix, starts the installed server the way the image's ENTRYPOINT does, and probes it
# with the image's HEALTHCHECK command. CI runs it for the CUDA image (BACKEND=cuda, reusing the
# host's build/cuda tree); the CPU image is built for real by scripts/docker_image_test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="$(pwd)/build/docker-stage"
scripts/docker_build_stage.sh "$prefix"
port=$((20000 + RANDOM % 20000))
# The ENTRYPOINT's config, with the address and model path moved into the scratch prefix.
LD_LIBRARY_PATH="$prefix/lib" "$prefix/bin/llm-server" --config "$prefix/configs/container.json" \
  --listen-address "127.0.0.1:$port" --metrics-address off --http-address off \
  --model-dir "$prefix/models/tiny-llama" > build/docker-smoke.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do
  if "$prefix/bin/llm-healthcheck" "127.0.0.1:$port" 500 >/dev/null 2>&1; then
    echo "docker_smoke: installed server is SERVING on $port"
    exit 0
  fi
  sleep 0.2
done
echo "docker_smoke: health check never succeeded; server log:"
cat build/docker-smoke.log
exit 1
