# The Kokkos 4.6.01 source archives kvmap's scripts build from: versions, sha256 (the ones
# spack's recipes list for the upstream release tarballs) and where they come from. Sourced by
# install-deps.sh and gpu-check.sh; needs log() and cache_root.
#   fetch_source NAME SHA256 URL   prints the path of the checked archive: from $KVMAP_SOURCES
#                                  (default: ../shared/third_party beside the checkout), else
#                                  downloaded into $cache_root/downloads
kokkos4_version=4.6.01
kokkos4_sha256=b9d70e4653b87a06dbb48d63291bf248058c7c7db4bd91979676ad5609bb1a3a
kernels4_sha256=95b9357f37ab3b9c3913c00741acb2501831c28ea8664de67818ae79c69c5908
kokkos4_url="https://github.com/kokkos/kokkos/releases/download/$kokkos4_version/kokkos-$kokkos4_version.tar.gz"
kernels4_url="https://github.com/kokkos/kokkos-kernels/releases/download/$kokkos4_version/kokkos-kernels-$kokkos4_version.tar.gz"
sources_dir="${KVMAP_SOURCES:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/../shared/third_party}"

fetch_source() {
  local name="$1" sha="$2" url="$3" path
  if [ -f "$sources_dir/$name" ]; then
    path="$sources_dir/$name"
  else
    path="$cache_root/downloads/$name"
    if [ ! -f "$path" ]; then
      mkdir -p "$cache_root/downloads"
      log "downloading $url"
      python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
        "$url" "$path.part" >&2 && mv "$path.part" "$path"
    fi
  fi
  if ! echo "$sha  $path" | sha256sum --check --quiet - >&2; then
    log "$path does not have the sha256 of $name ($sha); remove it or fix KVMAP_SOURCES"
    exit 1
  fi
  echo "$path"
}

# The Kokkos and Kokkos Kernels archives, checked: their paths on two lines.
kokkos4_archives() {
  fetch_source "kokkos-$kokkos4_version.tar.gz" "$kokkos4_sha256" "$kokkos4_url"
  fetch_source "kokkos-kernels-$kokkos4_version.tar.gz" "$kernels4_sha256" "$kernels4_url"
}
