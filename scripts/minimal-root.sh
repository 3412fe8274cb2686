#!/usr/bin/env bash
# A minimal Debian root filesystem holding only what the README's Python section lists for a
# Heat user (scripts/test-pip.sh builds and tests the wheel inside it): debootstrap's minbase
# variant plus the packages below, without recommended packages. Built once and kept in
# $KVMAP_DEPS_PREFIX/pip-root (default ~/.cache/kvmap/pip-root); rebuilt when the package list,
# the Debian release or the mirror changes. Needs root (debootstrap, chroot); installs
# debootstrap from Debian's archive where it is missing. The mirror and release are this
# machine's own (its apt sources), never a fixed address. Prints the root's path.
#   scripts/minimal-root.sh [--list]   # --list: print the package list and exit
set -euo pipefail

# What a Heat user needs besides Python >= 3.12 (which the test brings in from the machine):
# a C++ compiler, an MPI with its headers and compiler wrapper (the one mpi4py uses), and CA
# certificates for pip's downloads. The README's Python section names exactly these.
pip_user_packages=(g++ libopenmpi-dev openmpi-bin ca-certificates)

if [ "${1:-}" = --list ]; then
  echo "${pip_user_packages[*]}"
  exit 0
fi

log() { echo "[kvmap-root] $*" >&2; }
if [ "$(id -u)" -ne 0 ]; then
  log "building and entering a root filesystem needs root (debootstrap, chroot, mount)"
  exit 1
fi

cache_root="${KVMAP_DEPS_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/kvmap}"
root="$cache_root/pip-root"

# This machine's Debian release and mirror (deb822 sources or sources.list).
. /etc/os-release
release="${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release}"
mirror=""
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
  mirror="$(awk '/^Types:.*deb( |$)/{d=1} /^URIs:/{if (d) {print $2; exit}}' /etc/apt/sources.list.d/debian.sources)"
fi
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
  mirror="$(awk -v r="$release" '$1 == "deb" && $3 == r {print $2; exit}' /etc/apt/sources.list)"
fi
[ -n "$mirror" ] || { log "found no Debian mirror in this machine's apt sources"; exit 1; }

stamp="$release $mirror ${pip_user_packages[*]}"
if [ -f "$root/.kvmap-complete" ] && [ "$(cat "$root/.kvmap-complete")" = "$stamp" ]; then
  log "minimal root: present in $root"
else
  if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap"
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >&2
  fi
  start=$(date +%s)
  rm -rf "$root"
  log "debootstrap --variant=minbase $release $root $mirror"
  debootstrap --variant=minbase "$release" "$root" "$mirror" >"$cache_root/pip-root.log" 2>&1 ||
    { tail -n 30 "$cache_root/pip-root.log" >&2; exit 1; }
  # apt resolves what debootstrap's --include cannot (alternatives such as automake | automaken).
  log "apt-get install --no-install-recommends ${pip_user_packages[*]}"
  chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    "${pip_user_packages[@]}" >>"$cache_root/pip-root.log" 2>&1 ||
    { tail -n 30 "$cache_root/pip-root.log" >&2; exit 1; }
  chroot "$root" apt-get clean
  # The package set as built: the test checks that nothing was added since.
  chroot "$root" dpkg-query -W -f '${Package}\n' | sort >"$root/.kvmap-packages"
  echo "${pip_user_packages[*]}" >"$root/.kvmap-user-packages"
  echo "$stamp" >"$root/.kvmap-complete"
  log "minimal root: built in $(($(date +%s) - start)) s ($(wc -l <"$root/.kvmap-packages") packages, $(du -sm "$root" | cut -f1) MiB)"
fi
# This machine's CA certificates (a proxy's own CA, where there is one), so that pip inside
# reaches PyPI as it does outside.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null 2>&1
fi
echo "$root"
