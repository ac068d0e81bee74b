#!/usr/bin/env bash
# Installs every Debian 12 package the project needs to build, test and serve.
# Idempotent: apt-get skips what is already present. Used by the README, .ci/run and the Dockerfile.
#   scripts/install_deps.sh           everything (development and CI)
#   scripts/install_deps.sh --image   only what the Docker build stage needs to compile the server
set -euo pipefail

IMAGE_PKGS=(
  build-essential cmake ninja-build pkg-config ccache ca-certificates
  libgrpc++-dev libgrpc-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libspdlog-dev libfmt-dev nlohmann-json3-dev catch2
  libopenblas-dev libpcre2-dev libcpp-httplib-dev libicu-dev libboost-dev
)
PKGS=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libgrpc++-dev libgrpc-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libspdlog-dev libfmt-dev nlohmann-json3-dev catch2
  libopenblas-dev libpcre2-dev libcpp-httplib-dev libicu-dev libssl-dev libboost-dev
  clang-format-14 gnuplot-nox
  hipcc libamdhip64-dev
  python3 python3-grpcio python3-protobuf python3-numpy python3-aiohttp python3-pytest python3-torch python3-jinja2
  # The grammar engine's JSON Schema conformance test: the standard suite and its oracle.
  json-schema-test-suite python3-jsonschema
  # CI builds the CPU Docker image with podman from a debootstrap-made Debian 12 base.
  podman debootstrap
)
if [ "${1:-}" = "--image" ]; then
  PKGS=("${IMAGE_PKGS[@]}")
fi
if [ "${LLM_SKIP_PY_TORCH:-0}" = "1" ]; then
  PKGS=("${PKGS[@]/python3-torch/}")
fi

missing=()
for p in "${PKGS[@]}"; do
  [ -z "$p" ] && continue
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PKGS[@]} packages present"
  exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install_deps: installed ${missing[*]}"
