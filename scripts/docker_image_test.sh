#!/usr/bin/env bash
# Builds the CPU Docker image with podman and checks it from inside the build: the Dockerfile's
# test stage starts the installed server the way the ENTRYPOINT does, as the image's user, and
# requires the HEALTHCHECK command and one Generate call to pass. Base images are made locally
# from Debian's mirror (scripts/docker_base_image.sh). `podman run` is not used: it is refused
# (setrlimit) on some of these machines, while `podman build --isolation=chroot` works.
# Prints the image size and the build time. Fails, never skips, when podman cannot build.
#   scripts/docker_image_test.sh [extra podman build args]
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v podman >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
  echo "docker_image_test: FAIL: podman or debootstrap missing (scripts/install_deps.sh has them)"
  exit 1
fi
if ! podman info >/dev/null 2>&1; then
  echo "docker_image_test: FAIL: podman cannot run on this machine:"
  podman info 2>&1 | tail -5
  exit 1
fi
t0=$(date +%s)
scripts/docker_base_image.sh
base_secs=$(($(date +%s) - t0))
# HEALTHCHECK exists only in the docker image format (OCI drops it); --pull=never keeps the local
# base images; --layers reuses unchanged stages; the ccache mount speeds up repeated builds.
build=(podman build --cgroup-manager=cgroupfs --isolation=chroot --pull=never --format docker
       --layers --build-arg BACKEND=cpu "$@")
mkdir -p build
start=$(date +%s)
if ! "${build[@]}" --target test -t llm-server:cpu-test . >build/docker-image-test.log 2>&1; then
  echo "docker_image_test: FAIL: podman build --target test failed; last lines of its log:"
  tail -60 build/docker-image-test.log
  exit 1
fi
grep '^docker_image_check:' build/docker-image-test.log ||
  echo "docker_image_test: test stage reused from the layer cache (same inputs passed before)"
"${build[@]}" -t llm-server:cpu . >>build/docker-image-test.log 2>&1
secs=$(($(date +%s) - start))
if [ "$(podman image inspect --format '{{json .Config.Healthcheck}}' llm-server:cpu)" = null ]; then
  echo "docker_image_test: FAIL: llm-server:cpu has no HEALTHCHECK"
  exit 1
fi
# Layers of earlier runs speed up this one; dangling ones older than three days are dropped so disk
# use stays bounded on a reused machine.
podman image prune -f --filter until=72h >/dev/null
size=$(podman image inspect --format '{{.Size}}' llm-server:cpu)
printf 'docker_image_test: llm-server:cpu OK: image %d MB; base %ds, podman build %dm%02ds\n' \
  $((size / 1000000)) "$base_secs" $((secs / 60)) $((secs % 60))
