#!/usr/bin/env bash
# The main job: train with the high-level API (`Model.fit`, with loss and accuracy plots), train in
# eager mode, convert to a static graph and save it, load it back and
# keep training, compile the saved model to a native executable, run it on the held-out digits
# (accuracy and latency), the same in mixed precision (bf16) and quantized to int8 (post-training,
# `oar quantize`), then inspect the model with the oar CLI.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/demo
# Release by default; scripts/test.sh runs it with OAR_DEMO_PROFILE=dev to reuse the test build
# (the dev profile optimizes too: opt-level 1, dependencies 2) instead of compiling everything again.
profile=${OAR_DEMO_PROFILE:-release}
bin=target/$([ "$profile" = dev ] && echo debug || echo "$profile")
# One build at the workspace level (the features the tests build with: no rebuild after them).
cargo build --profile "$profile" --quiet --workspace --bins --example fit_digits --example to_static --example demo \
    --example score
echo "== 1. train: examples/fit_digits.rs (Model.fit: a CNN in ten lines, with curves drawn as SVG)"
"$bin"/examples/fit_digits "$out/plots"
echo
echo "== 2. convert: examples/to_static.rs (eager CNN → jit::save → jit::load → fine-tune → save)"
"$bin"/examples/to_static "$out"
echo
n=$(cat "$out/digits_test.count")
echo "== 3. compile: oar compile $out/digits_cnn_tuned.oar --target cpu --emit exe --bind N=$n -o $out/digits_cnn"
"$bin"/oar compile "$out/digits_cnn_tuned.oar" --target cpu --emit exe --bind "N=$n" -o "$out/digits_cnn"
echo
echo "== 4. run the native executable on the $n held-out digits"
"$out/digits_cnn" --input "image=$out/digits_test.npy" --output-dir "$out/exe_out" --bench 20
"$bin"/examples/score "$out/exe_out/output.npy" "$out/digits_test_labels.npy"
echo
echo "== 5. mixed precision: oar compile ... --precision bf16 (the amp pass: convolutions and matmuls in bf16, softmax in f32)"
"$bin"/oar compile "$out/digits_cnn_tuned.oar" --target cpu --emit exe --bind "N=$n" --precision bf16 -o "$out/digits_cnn_bf16"
"$out/digits_cnn_bf16" --input "image=$out/digits_test.npy" --output-dir "$out/exe_bf16_out" --bench 20
"$bin"/examples/score "$out/exe_bf16_out/output.npy" "$out/digits_test_labels.npy"
echo
echo "== 6. int8: oar quantize (post-training: calibrated on 256 training digits) → compile → run"
"$bin"/oar quantize "$out/digits_cnn_tuned.oar" --calibrate "$out/digits_calib.npy" --method kl --per-channel \
    -o "$out/digits_cnn_int8.oar"
"$bin"/oar compile "$out/digits_cnn_int8.oar" --target cpu --emit exe --bind "N=$n" -o "$out/digits_cnn_int8"
"$out/digits_cnn_int8" --input "image=$out/digits_test.npy" --output-dir "$out/exe_int8_out" --bench 20
"$bin"/examples/score "$out/exe_int8_out/output.npy" "$out/digits_test_labels.npy"
echo
echo "== 7. inspect: oar inspect $out/digits_cnn_tuned.oar"
"$bin"/oar inspect "$out/digits_cnn_tuned.oar"
echo
echo "== 8. run (JIT, cpu backend): oar run $out/digits_cnn_tuned.oar --input image=$out/digits4.npy --output $out/out"
"$bin"/oar run "$out/digits_cnn_tuned.oar" --input "image=$out/digits4.npy" --output "$out/out"
echo
echo "== 9. the compiler view: examples/demo.rs (IR text, decompose into primitives, reference backend)"
"$bin"/examples/demo "$out"
"$bin"/oar dot "$out/digits_cnn_tuned.oar" -o "$out/digits_cnn.dot"
echo "wrote $out/out/output.npy and $out/digits_cnn.dot"
