#!/usr/bin/env bash
# Runs every test: formatting, lints, the whole workspace's tests, and the demo.
# Installs what the tests need first (idempotent). CI runs the default, which samples two heavy
# suites (the per-kernel MLIR→PTX sweep, a third of its cases; the macro's compile-error tests,
# left out); `OAR_TEST_FULL=1 scripts/test.sh` runs everything whole (about 8 minutes more).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
# A run from a clean clone gains nothing from incremental state, which is the biggest part of
# target/ (a CI run once ran out of disk): build without it unless the caller asks for it.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
mkdir -p target
# Disk use and elapsed time after each step, so a full disk or a slow step shows where.
step() { echo "   (at ${SECONDS}s: $1)"; }
disk() { echo "   (at ${SECONDS}s; disk: target $(du -sh target 2>/dev/null | cut -f1), free $(df -h --output=avail . | tail -n 1 | tr -d ' '))"; }

rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt clippy || true

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
disk
echo "== cargo test"
python3 -c "import onnx, onnxruntime" 2>/dev/null || pip install -q -r tools/onnx_requirements.txt onnxruntime==1.32.0
# ptxas (NVIDIA's PTX assembler, no GPU needed) checks every generated PTX kernel.
python3 -c 'import nvidia.cuda_nvcc' 2>/dev/null || pip install -q nvidia-cuda-nvcc-cu12
export OAR_REQUIRE_PTXAS=1
# Libraries, binaries and test targets, then the doc tests. Not the examples: clippy above checked
# them, and the steps below build the ones they run (linking a dozen bench programs costs minutes).
cargo test --workspace --lib --bins --tests --quiet 2>&1 | tee target/test.log
step "workspace tests"
cargo test --workspace --doc --quiet 2>&1 | tee -a target/test.log
step "doc tests"
# The runtime's hand-written kernels again through their AVX2 and baseline instances
# (OAR_CPU_SIMD narrows what the host would pick): the test binary the run above built, run
# directly (`cargo test -p oar-cpu-runtime` would resolve features for that crate alone and
# build it again).
runtime_tests=$(cargo test --workspace --lib --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "oar_cpu_runtime" and m.get("executable"):
        print(m["executable"])')
for simd in avx2 baseline; do
    OAR_CPU_SIMD=$simd "$runtime_tests" -q 2>&1 | tee -a target/test.log
done
# The network planned on the blocked channel layout, in blocks of 8 (AVX2) against the reference.
cpu_tests=$(cargo test --workspace --tests --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if (m.get("reason") == "compiler-artifact" and m["target"]["name"] == "cpu" and m.get("executable")
            and m["manifest_path"].endswith("backends/cpu/Cargo.toml")):
        print(m["executable"])')
OAR_CPU_SIMD=avx2 "$cpu_tests" -q blocked_layout 2>&1 | tee -a target/test.log
step "cpu runtime kernels as avx2 and baseline"
# Everything the steps below run, in one build at the workspace level: the same features as the
# test run, so its libraries are reused (a `-p` build resolves features anew and rebuilds them).
cargo build --workspace --bins --example onnx_conformance --example fit_digits --example to_static \
    --example demo --example score --example fit_cifar --example fit_text --example fit_ctr --quiet
step "examples"
# The high-level API's examples on their synthetic data (each fails below its accuracy or AUC
# target): ResNet-18 on CIFAR-format files, an LSTM text classifier, Wide&Deep with AUC.
target/debug/examples/fit_cifar | tail -n 2
target/debug/examples/fit_text | tail -n 1
target/debug/examples/fit_ctr | tail -n 1
step "fit examples"
echo "== distributed and parameter server (cargo features \`distributed\`, \`ps\`)"
# Open MPI for oar::distributed; its tests start themselves under mpirun on 2-8 ranks. Both
# features in every command, so that oar is built once more, not twice.
dpkg -s libopenmpi-dev openmpi-bin > /dev/null 2>&1 \
    || { apt-get update -q && apt-get install -y -q libopenmpi-dev openmpi-bin; } > target/apt-mpi.log 2>&1 \
    || { cat target/apt-mpi.log; exit 1; }
cargo clippy -p oar --features distributed,ps --all-targets --quiet -- -D warnings
cargo test -p oar --features distributed,ps --test distributed --test ps --quiet 2>&1 | tee -a target/test.log
cargo build -p oar --features distributed,ps --example dp_mlp --example hybrid_gpt --example ps_ctr --quiet
target/debug/oar launch -n 2 target/debug/examples/dp_mlp
# Pipeline × tensor parallel on 4 ranks (docs/DISTRIBUTED.md has the 8-rank dp × pp × mp run).
target/debug/oar launch -n 4 target/debug/examples/hybrid_gpt --mp 2 --pp 2 | tail -n 2
step "distributed"
# The recommendation example on 2 shard and 2 trainer processes, its data written by the
# command (docs/PARAMETER_SERVER.md has the 10^6-row runs).
# The same job with the dense part on a heterogeneous trainer (another device: host memory,
# kernels compiled by the cpu backend) must give the same AUC: the split is exact.
target/debug/oar ps gen-data --out target/ps-ctr --rows 100000 --test-rows 20000 --files 2
ps_tables=(--table wide,sparse,dim=1,opt=adagrad,lr=0.2 --table emb,sparse,dim=8,opt=adagrad,lr=0.2
    --table dense,dense,opt=adam,lr=0.001)
ps_ctr=(target/debug/examples/ps_ctr --data target/ps-ctr --batch 256 --min-auc-gap 0.15)
cpu_auc=$(target/debug/oar ps launch --servers 2 --trainers 2 --mode sync "${ps_tables[@]}" -- "${ps_ctr[@]}" 2>&1 \
    | tee target/ps-ctr.log | grep '^ps_ctr auc=' | cut -d' ' -f2)
heter_auc=$(target/debug/oar ps launch --servers 2 --trainers 2 --heter-trainers 1 --mode sync "${ps_tables[@]}" \
    -- "${ps_ctr[@]}" 2>&1 | tee target/ps-ctr-heter.log | grep '^ps_ctr auc=' | cut -d' ' -f2)
echo "ps_ctr, 2 sync trainers: $cpu_auc; with a heter trainer: $heter_auc"
[ -n "$cpu_auc" ] && [ "$cpu_auc" = "$heter_auc" ] || { cat target/ps-ctr.log target/ps-ctr-heter.log; exit 1; }
step "parameter server example"
disk
# The steps from here to the mlir phase reuse what the workspace run built; the mlir phase comes
# last because its feature changes what `oar` and `oar-cli` are built with.
echo "== onnx node tests"
python3 tools/gen_onnx_node_tests.py target/onnx-node-tests > /dev/null
step "onnx node tests generated"
target/debug/examples/onnx_conformance target/onnx-node-tests --baseline onnx/tests/onnx_baseline.txt
disk
echo "== demo"
# In the dev profile, which the tests above built (a release build of everything would cost
# minutes of compilation; the demo itself runs in seconds either way).
OAR_DEMO_PROFILE=dev scripts/demo.sh > target/demo.log 2>&1 || { cat target/demo.log; exit 1; }
tail -n 3 target/demo.log
disk
echo "== fuzz"
# Every fuzz target, briefly, from its committed corpus (scripts/fuzz.sh; a long run is in
# docs/RELIABILITY.md). OAR_FUZZ_SECONDS=0 skips it.
fuzz_secs=${OAR_FUZZ_SECONDS:-10}
if [ "$fuzz_secs" != 0 ]; then scripts/fuzz.sh "$fuzz_secs"; fi
disk
# The workspace's test executables have run; the mlir steps below build their own (each links
# LLVM/MLIR), so drop these first to bound the peak disk use. Libraries stay.
find target/debug/deps -maxdepth 1 -type f -perm -u+x ! -name '*.so' ! -name '*.d' -delete
disk
echo "== mlir backend (LLVM/MLIR 19, cargo feature \`mlir\`)"
# The mlir feature links LLVM/MLIR into each binary built with it, so it gets its own steps
# (not the workspace run above): the crate's tests, the conformance kit, ptxas on its PTX.
MLIR_PKGS="libmlir-19-dev mlir-19-tools llvm-19-dev libclang-19-dev libpolly-19-dev libzstd-dev"
# shellcheck disable=SC2086
dpkg -s $MLIR_PKGS > /dev/null 2>&1 || { apt-get update -q && apt-get install -y -q $MLIR_PKGS; } > target/apt-mlir.log 2>&1 \
    || { tail -n 20 target/apt-mlir.log; exit 1; }
step "mlir packages"
export MLIR_SYS_190_PREFIX=/usr/lib/llvm-19 TABLEGEN_190_PREFIX=/usr/lib/llvm-19
# The backend's code exists only with the feature: lint it. The feature also gates a few lines
# outside the backend (a registry entry, `oar compile/run --target mlir`, the kit's and the cli's
# mlir tests); the full run (OAR_TEST_FULL=1) lints those targets with it too.
cargo clippy -p oar-backend-mlir --features mlir --all-targets --quiet -- -D warnings
step "clippy oar-backend-mlir"
if [ -n "${OAR_TEST_FULL:-}" ]; then
    cargo clippy -p oar -p oar-conformance --features mlir --lib --quiet -- -D warnings
    cargo clippy -p oar-conformance --features mlir --test kit --quiet -- -D warnings
    cargo clippy -p oar-cli --features mlir --bins --test cli --quiet -- -D warnings
    step "clippy of the feature's other targets"
fi
cargo test -p oar-backend-mlir --features mlir --quiet 2>&1 | tee -a target/test.log
step "oar-backend-mlir tests"
cargo test -p oar-conformance --features mlir --test kit --quiet mlir 2>&1 | tee -a target/test.log
step "conformance kit on mlir"
cargo test -p oar-cli --features mlir --test cli --quiet compile_mlir 2>&1 | tee -a target/test.log
step "cli compile_mlir"
disk
if [ -n "${OAR_TEST_FULL:-}" ]; then
    echo "== full run: the suites the default run samples or leaves out"
    # The per-kernel MLIR→PTX sweep above ran whole (OAR_TEST_FULL reaches it); the macro's
    # compile-error tests build oar again in trybuild's target dir.
    cargo test -p oar --test framework --quiet macro_ui -- --ignored 2>&1 | tee -a target/test.log
    step "macro compile-error tests"
fi
# One closing line for CI: totals over every test binary.
awk '/^test result:/ { p += $4; f += $6 } END { printf "%d passed, %d failed\n", p, f; exit (f > 0) }' target/test.log
