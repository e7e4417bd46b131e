#!/usr/bin/env bash
# Runs on a lent GPU machine (see scripts/gpu_prepare.sh): the PTX conformance suite, the eager
# GPU tensor tests and (if prepared) the mlir-gpu conformance run, all with OAR_REQUIRE_GPU=1 (a
# missing GPU fails), then the benchmarks against PyTorch. Logs go to $OUT when the device
# tool sets it.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-target/gpu-check}
bin=/tmp/oar-gpu
mkdir -p "$out" "$bin"
for f in .gpu/*.xz; do
  name=$(basename "$f" .xz)
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$f" "$bin/$name"
  chmod +x "$bin/$name"
done
export OAR_REQUIRE_GPU=1
nvidia-smi -L || true
status=0
"$bin/framework" eager_device:: 2>&1 | tee "$out/eager_device.log" || status=1
"$bin/kit" ptx:: --nocapture 2>&1 | tee "$out/conformance_ptx.log" || status=1
if [ -x "$bin/kit_mlir" ]; then
  "$bin/kit_mlir" mlir::mlir_gpu --nocapture 2>&1 | tee "$out/conformance_mlir.log" || status=1
fi
OAR_BENCH_GPU_BIN="$bin/bench_gpu" bash bench/gpu.sh 2>&1 | tee "$out/bench.log" || status=1
exit $status
