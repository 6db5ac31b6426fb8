#!/usr/bin/env bash
# tests/toy/run.sh BIN — the toy codec (tests/toy/toy_codec.h) through the
# local transport (3 threads) and the mpi transport (mpirun -np 3): each
# passes its checks, and both give the same output bits.
set -u
bin=$1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
l=$("$bin") || { echo "toy: local failed: $l"; exit 1; }
echo "$l"
if ! command -v mpirun >/dev/null; then echo "toy: mpi skipped: no mpirun"; exit 0; fi
m=$(timeout 120 mpirun --oversubscribe -np 3 "$bin" mpi) || { echo "toy: mpi failed: $m"; exit 1; }
echo "$m"
[ "${l##*checksum }" = "${m##*checksum }" ] || { echo "toy: local and mpi outputs differ"; exit 1; }
echo "toy: ok (local == mpi, bit for bit)"
