#!/usr/bin/env bash
# Eager mode: oar vs PyTorch eager in one run, same threads (bench/eager.rs, bench/eager_torch.py):
# the first call of add/softmax/layer_norm on a new shape (oar compiles the kernel then),
# per-op overhead, elementwise/unary/reduction ops at 4K, 64K and 1M elements, softmax and
# layer_norm, MLP / LeNet-5 / LSTM training steps, and each training step's peak RSS.
# Prints milliseconds (MB for rss_*) and oar/torch (< 1: oar faster or smaller).
# Threads: OAR_BENCH_THREADS (default 2) for both.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${OAR_BENCH_THREADS:-2}
cargo build --release --quiet --example bench_eager
bin=./target/release/examples/bench_eager
oar_out=$(RAYON_NUM_THREADS=$threads $bin; for m in mlp lenet lstm; do RAYON_NUM_THREADS=$threads $bin rss $m; done)
torch_out=$(OAR_BENCH_THREADS=$threads python3 bench/eager_torch.py;
            for m in mlp lenet lstm; do OAR_BENCH_THREADS=$threads python3 bench/eager_torch.py rss $m; done)
echo "threads: $threads; cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
printf "%-22s %12s %12s %10s\n" workload oar torch oar/torch
join <(echo "$oar_out" | sort) <(echo "$torch_out" | sort) | while read -r name o t; do
  printf "%-22s %12.4f %12.4f %10.2f\n" "$name" "$o" "$t" "$(echo "$o / $t" | bc -l)"
done
