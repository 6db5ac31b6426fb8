#!/usr/bin/env bash
# Installs the Debian packages echo needs to build and test. Idempotent:
# does nothing when every package is already present.
set -euo pipefail
PKGS=(build-essential pkg-config clang libclang-rt-14-dev
      libjansson-dev check libsubunit-dev libpcre2-dev libutf8proc-dev
      libmicrohttpd-dev libsentencepiece-dev libcurl4-openssl-dev curl python3 gnuplot-nox
      openmpi-bin libopenmpi-dev iproute2 cmake
      groff-base)  # groff-base: scripts/accuracy-domains.sh renders man pages
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "echo: missing Debian packages: ${missing[*]}" >&2
  echo "run as root:  apt-get update && apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
