#!/usr/bin/env bash
# Makes the Debian 12 base images the Dockerfile starts from, locally, the way Debian's official
# images are made (debuerreotype: debootstrap --variant=minbase), for machines with podman but no
# registry access to docker.io:
#   debian:12        minbase bookworm from the Debian mirror this machine's apt uses
#   debian:12-slim   the same plus the official -slim rules: dpkg excludes docs, man pages and
#                    locales, so packages installed later do not bring them either
# The rootfs tarballs are cached under $LLM_DOCKER_CACHE (default ~/.cache/llm-docker); delete
# them to rebuild from the mirror. Existing images are kept.
# The mirrors are read from this machine's apt sources (/etc/apt/sources.list and
# /etc/apt/sources.list.d/, one-line and deb822 formats), so the images fetch from wherever the
# machine itself is allowed to; DEBIAN_MIRROR and DEBIAN_SECURITY_MIRROR override them.
#   scripts/docker_base_image.sh
#   scripts/docker_base_image.sh --print-mirrors   # only shows what the sources give
set -euo pipefail
cache="${LLM_DOCKER_CACHE:-$HOME/.cache/llm-docker}"
apt_dir="${APT_SOURCES_DIR:-/etc/apt}"

# "URI SUITE" for every enabled deb (binary) source of the machine's apt configuration.
apt_sources() {
  local f
  for f in "$apt_dir/sources.list" "$apt_dir"/sources.list.d/*.list; do
    [ -r "$f" ] || continue
    # deb [opt=value ...] URI SUITE COMPONENT...
    awk '$1 == "deb" { i = 2; if ($i ~ /^\[/) { while (i < NF && $i !~ /\]$/) i++; i++ }
                       if (i + 1 <= NF) print $i, $(i + 1) }' "$f"
  done
  for f in "$apt_dir"/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    # deb822: stanzas of "Key: value" lines, separated by blank lines.
    awk 'function flush(  nu, ns, u, s, i, j) {
           if (types ~ /(^|[ \t])deb([ \t]|$)/ && tolower(enabled) != "no") {
             nu = split(uris, u); ns = split(suites, s)
             for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++) print u[i], s[j]
           }
           types = uris = suites = enabled = key = ""
         }
         /^#/ { next }
         /^[ \t]*$/ { flush(); next }
         /^[ \t]/ { if (key == "uris") uris = uris " " $0
                    if (key == "suites") suites = suites " " $0
                    next }
         { c = index($0, ":"); key = tolower(substr($0, 1, c - 1)); v = substr($0, c + 1)
           if (key == "types") types = v; else if (key == "uris") uris = v
           else if (key == "suites") suites = v
           else if (key == "enabled") { enabled = v; gsub(/[ \t]/, "", enabled) } }
         END { flush() }' "$f"
  done
}

# The first source that serves `suite`, without a trailing slash (awk reads to the end, so no
# writer in the pipeline dies of a closed pipe under pipefail).
mirror_for() {
  apt_sources | awk -v s="$1" '
    !found && ($2 == s || $2 == s "/") { sub(/\/+$/, "", $1); found = $1 }
    END { if (found != "") print found }'
}

find_mirrors() {
  mirror="${DEBIAN_MIRROR:-$(mirror_for bookworm)}"
  security="${DEBIAN_SECURITY_MIRROR:-$(mirror_for bookworm-security)}"
  if [ -z "$mirror" ]; then
    echo "docker_base_image: no apt source under $apt_dir serves bookworm; set DEBIAN_MIRROR" >&2
    return 1
  fi
}

if [ "${1:-}" = --print-mirrors ]; then
  find_mirrors
  echo "bookworm: $mirror"
  echo "bookworm-security: ${security:-(none: the image gets no security suite)}"
  exit 0
fi
mkdir -p "$cache"

make_rootfs() {  # writes both tarballs from one debootstrap
  local dir mirror security
  find_mirrors || return 1
  dir="$(mktemp -d)"
  echo "docker_base_image: debootstrap --variant=minbase bookworm from $mirror"
  debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$cache/debootstrap.log" 2>&1 || {
    tail -20 "$cache/debootstrap.log"
    rm -rf "$dir"
    return 1
  }
  # The same suites as the official image, so security fixes reach both stages.
  {
    echo "deb $mirror bookworm main"
    echo "deb $mirror bookworm-updates main"
    [ -z "$security" ] || echo "deb $security bookworm-security main"
  } >"$dir/etc/apt/sources.list"
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
