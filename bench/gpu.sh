#!/usr/bin/env bash
# GPU benchmarks: oar's PTX backend (bench/gpu.rs) vs PyTorch (bench/gpu_torch.py) on the same
# GPU in one run; prints both and the ratios. Needs an NVIDIA GPU (sm_80+), its driver and torch.
# Without a GPU: `bench/gpu.sh --dry-run` builds every benchmark graph, writes its PTX to
# target/gpu-bench/ and assembles it with ptxas (pip install nvidia-cuda-nvcc-cu12).
# OAR_BENCH_GPU_BIN: a prebuilt bench_gpu (scripts/gpu_check.sh uses one built elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${OAR_BENCH_GPU_BIN:-}
if [ -z "$bin" ]; then
  cargo build --release --quiet --example bench_gpu
  bin=./target/release/examples/bench_gpu
fi
if [ "${1:-}" = "--dry-run" ]; then
  "$bin" --dry-run target/gpu-bench
  ptxas=${PTXAS:-$(python3 -c 'import nvidia.cuda_nvcc as m, os; print(os.path.join(list(m.__path__)[0], "bin", "ptxas"))')}
  for f in target/gpu-bench/*.ptx; do
    "$ptxas" -arch=sm_90 "$f" -o "${f%.ptx}.cubin" && echo "ptxas sm_90 ok: $f"
  done
  exit 0
fi
oar_out=$("$bin")
torch_out=$(python3 bench/gpu_torch.py)
echo "== oar";   echo "$oar_out"
echo "== torch"; echo "$torch_out"
python3 - "$oar_out" "$torch_out" <<'PY'
import sys
oar = dict(l.split() for l in sys.argv[1].splitlines() if l and not l.startswith("#"))
ref = dict(l.split() for l in sys.argv[2].splitlines() if l and not l.startswith("#"))
f = lambda d, k: float(d[k]) if k in d else float("nan")
print("== ratios")
print(f"fused elementwise, oar / own copy bandwidth: {f(oar, 'fused_of_copy'):.2f} (target >= 0.80)")
print(f"fused elementwise, oar / torch eager:        {f(oar, 'fused_gbs') / f(ref, 'fused_gbs'):.2f}x bandwidth")
if "fused_compiled_gbs" in ref:
    print(f"fused elementwise, oar / torch.compile:      {f(oar, 'fused_gbs') / f(ref, 'fused_compiled_gbs'):.2f}x bandwidth")
print(f"resnet18 b64, torch ms / oar ms:             {f(ref, 'resnet18_b64_ms') / f(oar, 'resnet18_b64_ms'):.2f}x")
print(f"mlp train step, torch ms / oar static ms:    {f(ref, 'mlp_train_ms') / f(oar, 'mlp_train_ms'):.2f}x")
print(f"mlp train step, torch ms / oar eager ms:     {f(ref, 'mlp_train_ms') / f(oar, 'mlp_train_eager_ms'):.2f}x")
PY
