#!/usr/bin/env bash
# Builds, here, what scripts/gpu_check.sh runs on a lent GPU machine (which has no Rust
# toolchain): the PTX test binaries and the GPU benchmark, stripped, in .gpu/ (git-ignored;
# the device tool's `carry` takes it: run(command="bash scripts/gpu_check.sh", carry=[".gpu"])).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu
cargo build --release --quiet --example bench_gpu
cp target/release/examples/bench_gpu .gpu/
for t in conformance_ptx eager_device; do
  exe=$(cargo test --quiet --no-run --test "$t" --message-format=json 2>/dev/null |
    python3 -c 'import sys, json
for line in sys.stdin:
    j = json.loads(line)
    if j.get("executable"): print(j["executable"])')
  cp "$exe" ".gpu/$t"
done
strip .gpu/*
du -sh .gpu/*
