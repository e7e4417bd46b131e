#!/usr/bin/env bash
# Runs on a lent GPU machine (see scripts/gpu_prepare.sh): the PTX conformance suite and the
# eager GPU tensor tests with OAR_REQUIRE_GPU=1 (a missing GPU fails), then the benchmarks
# against PyTorch. Logs go to $OUT when the device tool sets it.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-target/gpu-check}
mkdir -p "$out"
export OAR_REQUIRE_GPU=1
nvidia-smi -L || true
status=0
.gpu/eager_device 2>&1 | tee "$out/eager_device.log" || status=1
.gpu/conformance_ptx --nocapture 2>&1 | tee "$out/conformance_ptx.log" || status=1
OAR_BENCH_GPU_BIN=.gpu/bench_gpu bash bench/gpu.sh 2>&1 | tee "$out/bench.log" || status=1
exit $status
