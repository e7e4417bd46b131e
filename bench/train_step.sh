#!/usr/bin/env bash
# Training-step throughput: oar (to_static train step compiled on `cpu`, and eager) vs PyTorch
# eager, same models, shapes and optimizer, alternating in rounds. Prints medians and ratios.
# Threads: OAR_BENCH_THREADS (default 2) for both oar (RAYON_NUM_THREADS) and PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${OAR_BENCH_THREADS:-2}
cargo build --release --quiet --example bench_train_step
# The machine's speed drifts within seconds: the two sides alternate, OAR_BENCH_ROUNDS rounds
# (default 5, the order flipping each round), and the table reports medians over rounds of
# each time and of the per-round ratio.
rounds=${OAR_BENCH_ROUNDS:-5}
rows=""
for round in $(seq "$rounds"); do
  oar_first() { RAYON_NUM_THREADS=$threads ./target/release/examples/bench_train_step; }
  torch_first() { OAR_BENCH_THREADS=$threads python3 bench/train_step_torch.py; }
  if [ $((round % 2)) = 1 ]; then
    o=$(oar_first); t=$(torch_first)
  else
    t=$(torch_first); o=$(oar_first)
  fi
  rows+="$(join <(echo "$o" | sort) <(echo "$t" | sort))"$'\n'
done
echo "threads: $threads; medians over $rounds rounds"
echo -n "$rows" | python3 -c '
import statistics as st, sys
rows = {}
for line in sys.stdin:
    name, s, e, t = line.split()
    rows.setdefault(name, []).append((float(s), float(e), float(t)))
print("%-8s %12s %12s %12s %17s  %s" % ("model", "oar static", "oar eager", "torch eager", "torch/oar static",
      "per round"))
for name in sorted(rows):
    r = rows[name]
    per = [t / s for s, _, t in r]
    print("%-8s %9.3f ms %9.3f ms %9.3f ms %16.2fx  %s" % (name, st.median(x[0] for x in r), st.median(x[1] for x in r),
          st.median(x[2] for x in r), st.median(per), " ".join("%.2f" % p for p in per)))
'
