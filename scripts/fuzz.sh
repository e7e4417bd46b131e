#!/usr/bin/env bash
# Runs oar's fuzz targets (fuzz/fuzz_targets: the .oar loader, the graph JSON, the IR text parser,
# .npy and ONNX import) with libFuzzer, coverage-guided, on stable Rust.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]      (default: 30 s each, every target)
#
# CI runs it briefly (scripts/test.sh); a long run is the same command with a bigger budget,
# e.g. `scripts/fuzz.sh 28800 load_onnx` for a night on the ONNX importer (docs/RELIABILITY.md).
# Each target starts from its committed corpus (fuzz/corpus/TARGET.tar.gz, a few thousand small
# inputs kept as one archive) and seeds (fuzz/seeds/TARGET); new interesting inputs go to
# target/fuzz/corpus/TARGET, never into the repository — fold them in with
# `scripts/fuzz.sh --merge [TARGET...]` (libFuzzer's -merge=1 keeps only inputs that add coverage;
# the archive is rewritten reproducibly). A crash stops the run with a non-zero exit and leaves the input in
# target/fuzz/artifacts/TARGET/ (replay it: target/fuzz/bin/TARGET FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
merge=0
if [ "${1:-}" = "--merge" ]; then
    merge=1
    shift
    secs=0
else
    secs=${1:-30}
    shift || true
fi
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(load_model graph_json parse_text read_npy load_onnx)
fi

# What cargo-fuzz passes, minus the sanitizer (needs nightly): SanitizerCoverage for libFuzzer's
# guidance, debug assertions and overflow checks on. `--target` keeps the flags off build scripts
# and proc macros.
host=$(rustc -vV | sed -n 's/^host: //p')
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks"
export CARGO_TARGET_DIR="$PWD/target/fuzz/build"
(cd fuzz && cargo build --release --quiet --target "$host" --bins)
bin="$PWD/target/fuzz/build/$host/release"

for t in "${targets[@]}"; do
    archive=fuzz/corpus/$t.tar.gz
    committed=target/fuzz/committed/$t
    seeds=fuzz/seeds/$t
    rm -rf "$committed"
    mkdir -p "$committed" "$seeds" "target/fuzz/corpus/$t" "target/fuzz/artifacts/$t"
    [ -f "$archive" ] && tar -xzf "$archive" -C "$committed"
    extra=()
    # The importer also starts from the checker's invalid models and a real dynamic-shape export.
    [ "$t" = load_onnx ] && extra=(onnx/tests/corpus/invalid onnx/tests/models/dynamic)
    if [ $merge = 1 ]; then
        merged=target/fuzz/merged/$t
        rm -rf "$merged"
        mkdir -p "$merged" fuzz/corpus
        "$bin/$t" -merge=1 "$merged" "$committed" "target/fuzz/corpus/$t" "$seeds" "${extra[@]}" 2>&1 | tail -n 1
        tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$merged" -cf - . | gzip -n -9 > "$archive"
        echo "$archive: $(ls "$merged" | wc -l) inputs, $(du -h "$archive" | cut -f1)"
        continue
    fi
    echo "== fuzz $t (${secs}s)"
    # Inputs are small (models in the corpus are tens of KB); a slow or hungry input is a bug.
    "$bin/$t" "target/fuzz/corpus/$t" "$committed" "$seeds" "${extra[@]}" \
        -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="target/fuzz/artifacts/$t/" -print_final_stats=1 > "target/fuzz/$t.log" 2>&1 || {
        tail -n 40 "target/fuzz/$t.log"
        echo "fuzz target $t failed; the input is in target/fuzz/artifacts/$t/"
        exit 1
    }
    grep -E '^stat::number_of_executed_units|^stat::new_units_added|^stat::peak_rss_mb' "target/fuzz/$t.log" | tr '\n' ' '
    echo
done
