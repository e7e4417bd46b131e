#!/usr/bin/env bash
# Inference latency: oar `cpu` vs ONNX Runtime vs PyTorch on ResNet-18 @224 (batch 1 and 16),
# MobileNetV2 @224, a transformer encoder (4 layers, d 256, 4 heads, seq 128), an LSTM and a GRU
# (2 layers, 64 -> 256, seq 64), same weights and inputs, one run; then the training steps
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
cargo build --release --quiet --example bench_cpu_models
oar_out=$(RAYON_NUM_THREADS=$threads ./target/release/examples/bench_cpu_models "$dir" "$@")
ref_out=$(OAR_BENCH_THREADS=$threads python3 bench/cpu_models_ref.py "$dir" "$@")
echo "threads: $threads; medians of 30 runs after 3 warm-ups"
printf "%-20s %10s %10s %10s %9s %9s %11s %9s\n" model oar ort torch "ort/oar" "torch/oar" compile "err(ort)"
join <(echo "$oar_out" | sort) <(echo "$ref_out" | sort) | while read -r name med min comp err ortms torchms; do
  printf "%-20s %7.2f ms %7.2f ms %7.2f ms %8.2fx %8.2fx %8.0f ms %9s\n" "$name" "$med" "$ortms" "$torchms" \
    "$(echo "$ortms / $med" | bc -l)" "$(echo "$torchms / $med" | bc -l)" "$comp" "$err"
done
if [ "${OAR_BENCH_TRAIN:-1}" != 0 ] && [ $# -eq 0 ]; then
  echo
  bash bench/train_step.sh
fi
