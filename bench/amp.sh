#!/usr/bin/env bash
# Mixed precision on the cpu backend, one run: f32 vs bf16 vs f16 for ResNet-18 inference
# (batch 1, 224², `amp` pass) and the MLP / LeNet-5 training steps (batch 64, O1 auto_cast
# traced whole), time (median) and planned memory of temporaries, with ratios to f32.
# Threads: OAR_BENCH_THREADS (default 2). No Python needed.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${OAR_BENCH_THREADS:-2}
flags=$(grep -m1 '^flags' /proc/cpuinfo)
native=$(for f in avx512_bf16 avx512_fp16 amx_bf16; do if [[ " $flags " == *" $f "* ]]; then printf '%s ' "$f"; fi; done | xargs)
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(grep -m1 -o -w avx512f /proc/cpuinfo || grep -m1 -o -w avx2 /proc/cpuinfo), native half: ${native:-none}, $(nproc) cpus; threads: $threads"
cargo build --release --quiet --example bench_amp
out=$(RAYON_NUM_THREADS=$threads ./target/release/examples/bench_amp)
printf "%-16s %-5s %10s %9s %12s %9s %12s %9s\n" model dtype time "time/f32" "temps" "temps/f32" "saved" "saved/f32"
echo "$out" | awk '
  $2 == "f32" { t[$1] = $3; m[$1] = $4; a[$1] = $5 }
  { saved = a[$1] > 0 ? sprintf("%9.2f MB %8.2fx", $5 / 1e6, $5 / a[$1]) : sprintf("%12s %9s", "-", "-")
    printf "%-16s %-5s %7.2f ms %8.2fx %9.1f MB %8.2fx %s\n", $1, $2, $3, $3 / t[$1], $4 / 1e6, $4 / m[$1], saved }'
