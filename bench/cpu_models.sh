#!/usr/bin/env bash
# Inference latency: oar `cpu` vs ONNX Runtime vs PyTorch on ResNet-18 @224 (batch 1 and 16),
# MobileNetV2 @224, a transformer encoder (4 layers, d 256, 4 heads, seq 128), an LSTM and a GRU
# (2 layers, 64 -> 256, seq 64), same weights and inputs, timed in one process; then the training steps
# (bench/train_step.sh; OAR_BENCH_TRAIN=0 skips them). Names as arguments pick models.
# Needs torch, torchvision, onnxruntime (pip). Threads: OAR_BENCH_THREADS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${OAR_BENCH_THREADS:-2}
dir=target/models
for m in resnet18 mobilenet_v2 transformer_encoder lstm gru resnet18_b16; do
  [ -f "$dir/$m.onnx" ] || python3 tools/export_torch_models.py --size full --out "$dir" --models "$m"
done
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(grep -m1 -o -w avx512f /proc/cpuinfo || grep -m1 -o -w avx2 /proc/cpuinfo), $(nproc) cpus"
cargo build --release --quiet --example bench_cpu_models -p oar
cargo build --release --quiet -p oar-cli
# The machine's speed drifts by tens of percent within seconds, so oar, ONNX Runtime and
# PyTorch run in one process (bench/cpu_models_paired.py: oar's model compiled to a shared
# library and called through its C API), in alternating blocks; ratios are medians over rounds.
# bench_cpu_models compiles the same model in process (JIT) for the compile time.
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(resnet18 mobilenet_v2 transformer_encoder lstm gru resnet18_b16)
mkdir -p "$dir/lib"
echo "threads: $threads; per round a block of 5 runs of each engine, every order in turn; medians over ${OAR_BENCH_ROUNDS:-12} rounds"
printf "%-20s %10s %10s %10s %9s %9s %9s %9s  %s\n" model oar ort torch "ort/oar" "torch/oar" "compile" "err(ort)" \
  "ort/oar per round"
for m in "${names[@]}"; do
  ./target/release/oar import "$dir/$m.onnx" -o "$dir/lib/$m.oar" > /dev/null
  ./target/release/oar compile "$dir/lib/$m.oar" --emit so --cpu native -o "$dir/lib/lib$m.so" > /dev/null
  read -r _ _ _ comp _ < <(RAYON_NUM_THREADS=$threads ./target/release/examples/bench_cpu_models "$dir" "$m")
  read -r name oar ort torch r_ort r_torch err per < <(OAR_BENCH_THREADS=$threads \
    python3 bench/cpu_models_paired.py "$dir" "$m" "$dir/lib/lib$m.so" "${OAR_BENCH_ROUNDS:-12}")
  printf "%-20s %7.2f ms %7.2f ms %7.2f ms %8.2fx %8.2fx %6.0f ms %9s  %s\n" "$name" "$oar" "$ort" "$torch" "$r_ort" \
    "$r_torch" "$comp" "$err" "$per"
done
if [ "${OAR_BENCH_TRAIN:-1}" != 0 ] && [ $# -eq 0 ]; then
  echo
  bash bench/train_step.sh
fi
