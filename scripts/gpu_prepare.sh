#!/usr/bin/env bash
# Builds, here, what scripts/gpu_check.sh runs on a lent GPU machine (which has no Rust
# toolchain): the PTX test binaries, the GPU benchmark and — when LLVM/MLIR 19 is installed —
# the conformance kit built with MLIR (its `mlir-gpu` run launches MLIR-made PTX), stripped and
# xz-compressed into .gpu/ (git-ignored, ≈ 35 MB; the device tool's `carry` takes it:
# run(command="bash scripts/gpu_check.sh", carry=[".gpu"], timeout_s=540)).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu && mkdir -p .gpu
test_exe() { # the test binary of `cargo test --no-run "$@"`
  cargo test --quiet --no-run "$@" --message-format=json 2>/dev/null |
    python3 -c 'import sys, json
for line in sys.stdin:
    j = json.loads(line)
    if j.get("executable") and j.get("target", {}).get("kind") == ["test"]: print(j["executable"])'
}
cargo build --release --quiet --example bench_gpu
cp target/release/examples/bench_gpu .gpu/
cp "$(test_exe -p oar-conformance --test kit)" .gpu/kit
cp "$(test_exe -p oar --test framework)" .gpu/framework
if [ -d /usr/lib/llvm-19 ]; then
  export MLIR_SYS_190_PREFIX=/usr/lib/llvm-19 TABLEGEN_190_PREFIX=/usr/lib/llvm-19
  cp "$(test_exe -p oar-conformance --features mlir --test kit)" .gpu/kit_mlir
else
  echo "no LLVM/MLIR 19 here: .gpu/ gets no kit_mlir (the mlir-gpu run is skipped there)"
fi
strip .gpu/*
xz -9 -T2 .gpu/*
du -sh .gpu/*
