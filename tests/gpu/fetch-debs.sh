#!/usr/bin/env bash
# Download (not install) the Debian packages that building echo needs, into
# .gpu-debs/ at the repository root, so they can travel to a GPU machine
# that has no package registry. tests/gpu/run.sh unpacks them there with
# `dpkg -x` into a private prefix. Run here, from anywhere in the repo:
#
#     tests/gpu/fetch-debs.sh
#
# .gpu-debs/ must be ignored by git and named in the device call's `carry`.
# About 3 MiB. Needs the apt lists (`apt-get update` once, as root).
set -euo pipefail

cd "$(dirname "$0")/../.."
DEST=.gpu-debs

# -dev packages and the runtime libraries they point at; pkgconf in case the
# GPU machine has no pkg-config.
PKGS=(
  libjansson-dev libjansson4
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libutf8proc-dev libutf8proc2
  check libsubunit-dev libsubunit0
  libsentencepiece-dev libsentencepiece0
  libmicrohttpd-dev libmicrohttpd12
  pkgconf pkgconf-bin libpkgconf3
)

mkdir -p "$DEST"
rm -f "$DEST"/*.deb
cd "$DEST"
if ! apt-get download "${PKGS[@]}" 2>apt-download.log; then
  cat apt-download.log >&2
  echo "fetch-debs: apt-get download failed; run 'apt-get update' (as root) and retry" >&2
  exit 1
fi
rm -f apt-download.log
n=$(ls -1 ./*.deb | wc -l)
echo "fetch-debs: $n packages in $DEST ($(du -sh . | cut -f1))"
