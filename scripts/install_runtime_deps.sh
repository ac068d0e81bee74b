#!/usr/bin/env bash
# Runtime-only libraries for the slim Docker stage (no compilers, no -dev packages).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  libgrpc++1.51 libgrpc29 libprotobuf32 libspdlog1.10 libfmt9 libopenblas0-pthread \
  libpcre2-8-0 libcpp-httplib0.11 libicu72 libssl3 ca-certificates
# Downloaded .deb files and package lists are not needed at run time.
apt-get clean
rm -rf /var/lib/apt/lists/*
