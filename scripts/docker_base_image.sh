#!/usr/bin/env bash
# Makes the Debian 12 base images the Dockerfile starts from, locally, the way Debian's official
# images are made (debuerreotype: debootstrap --variant=minbase), for machines with podman but no
# registry access to docker.io:
#   debian:12        minbase bookworm from Debian's mirror
#   debian:12-slim   the same plus the official -slim rules: dpkg excludes docs, man pages and
#                    locales, so packages installed later do not bring them either
# The rootfs tarballs are cached under $LLM_DOCKER_CACHE (default ~/.cache/llm-docker); delete
# them to rebuild from the mirror. Existing images are kept.
#   scripts/docker_base_image.sh
set -euo pipefail
cache="${LLM_DOCKER_CACHE:-$HOME/.cache/llm-docker}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
mkdir -p "$cache"

make_rootfs() {  # writes both tarballs from one debootstrap
  local dir
  dir="$(mktemp -d)"
  echo "docker_base_image: debootstrap --variant=minbase bookworm from $mirror"
  debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$cache/debootstrap.log" 2>&1 || {
    tail -20 "$cache/debootstrap.log"
    rm -rf "$dir"
    return 1
  }
  # The same suites as the official image, so security fixes reach both stages.
  cat >"$dir/etc/apt/sources.list" <<SRC
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
SRC
  rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/*.bin "$dir"/var/cache/apt/archives/*.deb
  tar -C "$dir" -c . >"$cache/debian-bookworm-12.tar.tmp"
  cat >"$dir/etc/dpkg/dpkg.cfg.d/docker" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
CFG
  find "$dir/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$dir/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$dir"/usr/share/man/* "$dir"/usr/share/groff/* "$dir"/usr/share/info/* \
    "$dir"/usr/share/lintian/* "$dir"/usr/share/linda/*
  find "$dir/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
  tar -C "$dir" -c . >"$cache/debian-bookworm-12-slim.tar.tmp"
  mv "$cache/debian-bookworm-12.tar.tmp" "$cache/debian-bookworm-12.tar"
  mv "$cache/debian-bookworm-12-slim.tar.tmp" "$cache/debian-bookworm-12-slim.tar"
  rm -rf "$dir"
}

for tag in 12 12-slim; do
  if podman image exists "localhost/debian:$tag"; then
    echo "docker_base_image: debian:$tag present"
    continue
  fi
  tarball="$cache/debian-bookworm-$tag.tar"
  [ -s "$tarball" ] || make_rootfs
  podman import --quiet "$tarball" "debian:$tag" >/dev/null
  echo "docker_base_image: imported debian:$tag ($(du -h "$tarball" | cut -f1) rootfs)"
done
