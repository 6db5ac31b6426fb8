#!/usr/bin/env bash
# Download (not install) the Debian packages that building echo needs, into
# .gpu-debs/ at the repository root, so they can travel to a GPU machine
# that has no package registry. tests/gpu/run.sh unpacks them there with
# `dpkg -x` into a private prefix. Run here, from anywhere in the repo:
#
#     tests/gpu/fetch-debs.sh
#
# .gpu-debs/ must be ignored by git and named in the device call's `carry`.
# About 15 MiB. Needs the apt lists (`apt-get update` once, as root).
set -euo pipefail

cd "$(dirname "$0")/../.."
DEST=.gpu-debs

# The -dev packages the build needs (pkgconf in case the GPU machine has no
# pkg-config; libcurl for echo-bench), plus their whole dependency closure:
# the GPU machine's image is not Debian and may lack any of the runtime
# libraries (libgnutls30 under libmicrohttpd, libcurl4's many). run.sh keeps
# a library from these packages only where the machine has no library of
# that soname, so the extra packages never shadow the system's own.
# The C runtime and the toolchain's own libraries are never carried.
PKGS=(
  libjansson-dev libpcre2-dev libutf8proc-dev check libsubunit-dev
  libsentencepiece-dev libmicrohttpd-dev pkgconf libcurl4-openssl-dev
)
SKIP='^(libc6|libc6-dev|libc-dev-bin|libcrypt1|libcrypt-dev|linux-libc-dev|libgcc-s1|gcc-[0-9]+-base|libstdc\+\+6|mawk|rpcsvc-proto|libnsl-dev|libnsl2|libtirpc-dev|libtirpc3|libtirpc-common|zlib1g)$'
# Runtime libraries of the closure only: the build includes the headers of
# the named -dev packages, never those of their dependencies.
mapfile -t ALL < <({
  printf '%s\n' "${PKGS[@]}"
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
    --no-enhances "${PKGS[@]}" 2>/dev/null | grep '^[a-z0-9]' | grep -Ev -- '-dev$'
} | sort -u | grep -Ev "$SKIP")
if [ ${#ALL[@]} -lt ${#PKGS[@]} ]; then
  echo "fetch-debs: apt-cache knows too few packages; run 'apt-get update' (as root) and retry" >&2
  exit 1
fi

mkdir -p "$DEST"
rm -f "$DEST"/*.deb
cd "$DEST"
if ! apt-get download "${ALL[@]}" 2>apt-download.log; then
  cat apt-download.log >&2
  echo "fetch-debs: apt-get download failed; run 'apt-get update' (as root) and retry" >&2
  exit 1
fi
rm -f apt-download.log
n=$(ls -1 ./*.deb | wc -l)
echo "fetch-debs: $n packages in $DEST ($(du -sh . | cut -f1))"
