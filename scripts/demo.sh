#!/usr/bin/env bash
# The main job: train an MLP on the shipped digits in eager mode; then build a graph, save it,
# inspect it and run it with the oar CLI.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/demo
cargo build --release --quiet --bin oar --example demo --example mlp_digits
echo "== train: examples/mlp_digits.rs (eager: DataLoader, nn, autograd, Adam)"
./target/release/examples/mlp_digits
echo
echo "== graph: examples/demo.rs (build, save, decompose, run on the reference backend)"
./target/release/examples/demo "$out"
echo
echo "== oar inspect $out/mlp.oar --summary --bind N=4"
./target/release/oar inspect "$out/mlp.oar" --summary --bind N=4
echo
echo "== oar run $out/mlp.oar --input x=$out/x.npy --output $out/out"
./target/release/oar run "$out/mlp.oar" --input "x=$out/x.npy" --output "$out/out"
./target/release/oar dot "$out/mlp.oar" -o "$out/mlp.dot"
echo "wrote $out/out/probs.npy and $out/mlp.dot"
