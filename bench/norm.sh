#!/usr/bin/env bash
# layer_norm and softmax (native row kernels on the cpu backend), gelu and tanh vs PyTorch, same machine,
# same run, one thread each. Prints both tables and torch/oar time ratios (> 1: oar is faster).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c "import torch" 2>/dev/null || pip install --quiet torch
cargo build --release --quiet --example bench_norm
export RAYON_NUM_THREADS=1
oar=$(./target/release/examples/bench_norm)
pt=$(python3 bench/norm_torch.py)
echo "== oar";   echo "$oar"
echo "== torch"; echo "$pt"
echo "== ratio (torch time / oar time)"
paste <(echo "$oar") <(echo "$pt") | awk -F'[:,\t]' '{ split($2, a, " "); split($5, b, " "); printf "%s: %.2f\n", $1, b[1] / a[1] }'
