#!/usr/bin/env bash
# Installs the CUDA toolkit (nvcc, cuBLAS) on Debian 12 from NVIDIA's apt repository when nvcc is
# absent. A no-op where nvcc exists (CI and the dev machines), so the Docker build stage and CI run
# the same script.
set -euo pipefail
CUDA_VERSION="${CUDA_VERSION:-13-0}"
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "install_cuda_toolkit: nvcc present ($(command -v nvcc || echo /usr/local/cuda/bin/nvcc))"
  exit 0
fi
SUDO=""; [ "$(id -u)" != "0" ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends wget ca-certificates gnupg
tmp=$(mktemp -d)
wget -q -O "$tmp/keyring.deb" \
  https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb
$SUDO dpkg -i "$tmp/keyring.deb"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  "cuda-nvcc-${CUDA_VERSION}" "cuda-cudart-dev-${CUDA_VERSION}" "libcublas-dev-${CUDA_VERSION}"
echo "install_cuda_toolkit: installed CUDA ${CUDA_VERSION}"
