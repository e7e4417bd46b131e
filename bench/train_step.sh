#!/usr/bin/env bash
# Training-step throughput: oar (to_static train step compiled on `cpu`, and eager) vs PyTorch
# eager, same models, shapes and optimizer, in one run. Prints medians and ratios.
# Threads: OAR_BENCH_THREADS (default 2) for both oar (RAYON_NUM_THREADS) and PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${OAR_BENCH_THREADS:-2}
cargo build --release --quiet --example bench_train_step
oar_out=$(RAYON_NUM_THREADS=$threads ./target/release/examples/bench_train_step)
torch_out=$(OAR_BENCH_THREADS=$threads python3 bench/train_step_torch.py)
echo "threads: $threads"
printf "%-6s %12s %12s %12s %18s\n" model "oar static" "oar eager" "torch eager" "torch/oar static"
join <(echo "$oar_out" | sort) <(echo "$torch_out" | sort) | while read -r name s e t; do
  printf "%-6s %9.3f ms %9.3f ms %9.3f ms %17.2fx\n" "$name" "$s" "$e" "$t" "$(echo "$t / $s" | bc -l)"
done
