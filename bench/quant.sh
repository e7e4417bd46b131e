#!/usr/bin/env bash
# int8 inference, one run: oar f32 vs oar int8 (its own post-training quantization; int8rr: with
# 7-bit weights, `reduce_range`, which run on vpmaddubsw) vs oar on
# onnxruntime's QDQ model vs onnxruntime f32 and int8 (`quantize_static`, QDQ, u8 activations,
# per-channel i8 weights, min-max on the same 16 calibration images), ResNet-18 and MobileNetV2
# at batch 1, 224², seeded weights (bench/quant.rs, bench/quant_ref.py). Medians of RUNS
# (default 20) after 2 warm-ups. Threads: OAR_BENCH_THREADS (default 2). Needs onnxruntime and
# onnx (pip; tools/onnx_requirements.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${OAR_BENCH_THREADS:-2}
runs=${1:-20}
dir=target/models/quant
flags=$(grep -m1 '^flags' /proc/cpuinfo)
int8=$(for f in avx2 avx512_vnni avx_vnni amx_int8; do if [[ " $flags " == *" $f "* ]]; then printf '%s ' "$f"; fi; done | xargs)
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), int8 features: ${int8:-none}, $(nproc) cpus; threads: $threads"
cargo build --release --quiet --example bench_quant
./target/release/examples/bench_quant "$dir" export
python3 bench/quant_ref.py "$dir" quantize 2> "$dir/quantize.log" || { cat "$dir/quantize.log"; exit 1; }
oar_out=$(RAYON_NUM_THREADS=$threads ./target/release/examples/bench_quant "$dir" time "$runs")
ort_out=$(OAR_BENCH_THREADS=$threads python3 bench/quant_ref.py "$dir" time "$runs")
printf "%-13s %10s %10s %10s %13s %10s %10s %10s %12s\n" model "oar f32" "oar int8" "oar int8rr" "oar ort-qdq" "ort f32" "ort int8" "f32/int8rr" "ort8/oar8rr"
printf "%s\n%s\n" "$oar_out" "$ort_out" | awk '
  { t[$1, $2] = $3; if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 } }
  END { for (i = 1; i <= n; i++) { m = order[i]
    printf "%-13s %7.2f ms %7.2f ms %7.2f ms %10s ms %7.2f ms %7.2f ms %9.2fx %11.2fx\n", m, t[m, "f32"], t[m, "int8"],
      t[m, "int8_rr"], ((m, "int8_ort_qdq") in t ? sprintf("%.2f", t[m, "int8_ort_qdq"]) : "-"), t[m, "ort_f32"],
      t[m, "ort_int8"], t[m, "f32"] / t[m, "int8_rr"], t[m, "ort_int8"] / t[m, "int8_rr"] } }'
