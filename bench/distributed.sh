#!/usr/bin/env bash
# Data-parallel scaling on this machine: the same global batch on 1 and 2 MPI ranks (one
# compute thread per rank, so 2 ranks use the 2 cores 1 rank leaves half idle), for an MLP
# (784-1024-1024-10, batch 256) and a CIFAR-size ResNet-18 (batch 32); samples per second
# (median of STEPS, default 20, after 3 warm-ups), the scaling efficiency (2-rank throughput
# over twice the 1-rank one) and the all-reduce volume per step against the ring minimum; the
# 2-rank step also with the gradients averaged while backward runs (`DataParallel::backward`).
# Needs Open MPI (apt-get install libopenmpi-dev openmpi-bin). Noisy on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cpus"
cargo build --release --quiet --features distributed --example bench_distributed
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 RAYON_NUM_THREADS=1
for model in mlp resnet18; do
    one=$(mpirun -n 1 -x RAYON_NUM_THREADS target/release/examples/bench_distributed "$model" "$steps")
    two=$(mpirun -n 2 --oversubscribe -x RAYON_NUM_THREADS target/release/examples/bench_distributed "$model" "$steps")
    over=$(mpirun -n 2 --oversubscribe -x RAYON_NUM_THREADS target/release/examples/bench_distributed "$model" "$steps" overlap)
    echo "$one"
    echo "$two"
    echo "$over"
    awk -v a="$(echo "$one" | awk '{print $3}')" -v b="$(echo "$two" | awk '{print $3}')" -v m="$model" \
        'BEGIN { printf "%s: 2 ranks give %.2fx the 1-rank throughput, scaling efficiency %.0f%%\n", m, b / a, 50 * b / a }'
done
