#!/usr/bin/env bash
# Installs the CUDA toolkit (nvcc, cuBLAS) on Debian 12 from NVIDIA's apt repository when nvcc is
# absent. A no-op where nvcc exists (CI and the dev machines), so the Docker build stage and CI run
# the same script. The packages come through the machine's own apt sources; where those do not
# serve NVIDIA's repository yet, CUDA_KEYRING_URL names its cuda-keyring package for Debian 12
# (NVIDIA's CUDA installation guide, "network repo"), which adds the source and its key. No
# repository host is written here: the machine's configuration, or the caller, says where.
#   [CUDA_VERSION=13-0] [CUDA_KEYRING_URL=...] scripts/install_cuda_toolkit.sh
set -euo pipefail
CUDA_VERSION="${CUDA_VERSION:-13-0}"
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "install_cuda_toolkit: nvcc present ($(command -v nvcc || echo /usr/local/cuda/bin/nvcc))"
  exit 0
fi
SUDO=""; [ "$(id -u)" != "0" ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
pkgs=("cuda-nvcc-${CUDA_VERSION}" "cuda-cudart-dev-${CUDA_VERSION}" "libcublas-dev-${CUDA_VERSION}")
$SUDO apt-get update -qq
if ! apt-cache show "${pkgs[0]}" >/dev/null 2>&1; then
  if [ -z "${CUDA_KEYRING_URL:-}" ]; then
    echo "install_cuda_toolkit: no apt source of this machine serves ${pkgs[0]}; add NVIDIA's" \
      "CUDA repository for Debian 12, or set CUDA_KEYRING_URL to its cuda-keyring .deb" >&2
    exit 1
  fi
  $SUDO apt-get install -y -qq --no-install-recommends wget ca-certificates gnupg
  tmp=$(mktemp -d)
  wget -q -O "$tmp/keyring.deb" "$CUDA_KEYRING_URL"
  $SUDO dpkg -i "$tmp/keyring.deb"
  rm -rf "$tmp"
  $SUDO apt-get update -qq
fi
$SUDO apt-get install -y -qq --no-install-recommends "${pkgs[@]}"
echo "install_cuda_toolkit: installed CUDA ${CUDA_VERSION}"
