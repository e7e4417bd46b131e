#!/usr/bin/env bash
# oar eager kernels vs numpy (OpenBLAS), same machine, same run; one thread each.
# Prints both tables and the oar/numpy time ratio per matmul shape (< 1 means oar is faster).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c "import numpy" 2>/dev/null || pip install --quiet numpy
cargo build --release --quiet --example bench_kernels
export RAYON_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
oar=$(./target/release/examples/bench_kernels)
np=$(python3 bench/kernels_numpy.py)
echo "== oar";   echo "$oar"
echo "== numpy"; echo "$np"
echo "== ratio (oar time / numpy time)"
ratio() { awk -F'[:,]' '{ split($2, a, " "); split($4, b, " "); printf "%s: %.2f\n", $1, a[1] / b[1] }'; }
paste <(echo "$oar" | grep '^matmul') <(echo "$np") | ratio
paste <(echo "$oar" | grep '^cpu-backend matmul') <(echo "$np") | ratio
