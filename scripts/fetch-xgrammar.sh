#!/usr/bin/env bash
# Fetches and builds xgrammar (Apache-2.0), the grammar engine behind
# grammar/: the pinned PyPI sdist xgrammar==0.2.9 (self-contained: picojson
# and dlpack vendored), checked by sha256, its C++ core built as a static
# library (Release, no Python bindings, no LTO so C programs link it with
# plain gcc). Idempotent: a finished build with the same sha256 is kept.
#   scripts/fetch-xgrammar.sh [OUT_DIR]     (default build/xgrammar)
# Leaves OUT_DIR/libxgrammar.a and the headers under OUT_DIR/src. Set
# XGRAMMAR_SDIST to a local copy of the sdist to skip the download (its
# sha256 is checked the same). Progress and errors go to stderr.
set -euo pipefail
out=${1:-build/xgrammar}
ver=0.2.9
sha=87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90
url=https://files.pythonhosted.org/packages/3a/2f/5bf8e8fa6619cff534932f79b0abc81a417d354bc5093252c1a6081d0a93/xgrammar-$ver.tar.gz
if [ -f "$out/libxgrammar.a" ] && [ "$(cat "$out/.sha256" 2>/dev/null)" = "$sha" ]; then exit 0; fi
command -v cmake >/dev/null || { echo "fetch-xgrammar: cmake is missing (make deps installs it)" >&2; exit 1; }
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tgz="$tmp/xgrammar-$ver.tar.gz"
if [ -n "${XGRAMMAR_SDIST:-}" ]; then
  cp "$XGRAMMAR_SDIST" "$tgz"
else
  echo "fetch-xgrammar: downloading xgrammar-$ver.tar.gz from PyPI" >&2
  if ! curl -fsSL --retry 3 --max-time 300 -o "$tgz" "$url"; then
    echo "fetch-xgrammar: download of $url failed (is PyPI reachable? or set XGRAMMAR_SDIST)" >&2
    exit 1
  fi
fi
got=$(sha256sum "$tgz" | cut -d' ' -f1)
if [ "$got" != "$sha" ]; then
  echo "fetch-xgrammar: xgrammar-$ver.tar.gz has sha256 $got, expected $sha" >&2
  exit 1
fi
rm -rf "$out/src" "$out/cmake" "$out/libxgrammar.a" "$out/.sha256"
mkdir -p "$out/src" "$out/cmake"
tar xzf "$tgz" -C "$out/src" --strip-components=1
# The sdist's cmake/config.cmake turns the Python bindings on unconditionally;
# a config.cmake in the build folder takes precedence over it.
cat >"$out/cmake/config.cmake" <<'CFG'
set(CMAKE_BUILD_TYPE Release)
set(XGRAMMAR_BUILD_PYTHON_BINDINGS OFF)
set(XGRAMMAR_BUILD_CXX_TESTS OFF)
set(XGRAMMAR_ENABLE_CPPTRACE OFF)
CFG
echo "fetch-xgrammar: building libxgrammar.a (a few minutes)" >&2
t0=$(date +%s)
cmake -S "$out/src" -B "$out/cmake" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="-fno-lto -g0" >"$out/cmake.log" 2>&1 ||
  { tail -20 "$out/cmake.log" >&2; exit 1; }
cmake --build "$out/cmake" --target xgrammar -j "${XGRAMMAR_JOBS:-$(nproc)}" >"$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log" >&2; exit 1; }
cp "$out/cmake/libxgrammar.a" "$out/libxgrammar.a"
echo "$sha" >"$out/.sha256"
echo "fetch-xgrammar: $out/libxgrammar.a ready in $(( $(date +%s) - t0 )) s" >&2
