#!/usr/bin/env bash
# The parameter server (issue 22) on loopback: `oar ps launch` runs examples/ps_ctr
# (Wide&Deep, batch 512) for 1, 2 and 4 trainers × 1 and 2 shards, in sync and async mode,
# each job over one epoch of the same synthetic Criteo-like data in total (every trainer takes
# rows / (trainers · batch) steps). Per configuration, the median over RUNS runs (default 3)
# of: the total samples/s (summed over trainers), the bytes each trainer sends and receives
# per step, its RPCs per step, the held-out AUC beside the planted teacher's, and the sparse
# rows materialised on the shards. Trainers and shards share this machine's cores, so it
# measures the protocol and the servers, not scaling across machines. Noisy on a shared
# machine.
#
#   bench/ps.sh [ROWS]        training rows (default 400000; or the environment variable ROWS)
#   RUNS=5 bench/ps.sh        runs per configuration (default 3)
#   PS_TRAINERS="1 2" PS_SERVERS=1 PS_MODES=async bench/ps.sh    a subset
#   HETER=0 bench/ps.sh       without the heterogeneous split (by default: `sync+heter`, the
#                             sync job with its dense part on one heter trainer, for 1 and 2
#                             trainers on 2 shards, beside the CPU-only rows)
#
# The data goes to target/bench-ps (made once; kept while its train/meta.json has ROWS rows),
# each run's output to target/bench-ps/logs/.
set -euo pipefail
cd "$(dirname "$0")/.."

rows=${1:-${ROWS:-400000}}
runs=${RUNS:-3}
trainer_counts=${PS_TRAINERS:-1 2 4}
server_counts=${PS_SERVERS:-1 2}
modes=${PS_MODES:-sync async}
batch=512
data=target/bench-ps
logs=$data/logs
test_rows=20000
case "$rows" in '' | *[!0-9]*) echo "bench/ps.sh: ROWS must be a number, got '$rows'" >&2; exit 2 ;; esac
case "$runs" in '' | *[!0-9]* | 0) echo "bench/ps.sh: RUNS must be a positive number, got '$runs'" >&2; exit 2 ;; esac

cpuinfo() { grep -m1 "^$1[[:space:]]*:" /proc/cpuinfo | cut -d: -f2- | xargs; }
cpu="$(cpuinfo 'model name') (family $(cpuinfo 'cpu family'), model $(cpuinfo model)), $(nproc) cpus"
echo "cpu: $cpu"

# The job in flight, stopped (with its shards and trainers) if this script is interrupted:
# `oar ps launch` takes SIGTERM as Ctrl-C and kills its trainers' process groups.
job=
stop_job() {
    if [ -n "$job" ] && kill -0 "$job" 2>/dev/null; then
        kill -TERM "$job" 2>/dev/null || true
        wait "$job" 2>/dev/null || true
    fi
    job=
}
trap 'stop_job; echo "bench/ps.sh: interrupted" >&2; exit 130' INT TERM
table=
trap 'stop_job; rm -f "$table"' EXIT

cargo build --release --quiet -p oar-cli
cargo build --release --quiet --features ps --example ps_ctr
oar=target/release/oar
ps_ctr=target/release/examples/ps_ctr

# The data, once per row count.
if grep -qE "\"rows\": *$rows," "$data/train/meta.json" 2>/dev/null &&
    grep -qE "\"rows\": *$test_rows," "$data/test/meta.json" 2>/dev/null; then
    echo "data: $data has $rows training rows"
else
    rm -rf "$data/train" "$data/test"
    "$oar" ps gen-data --out "$data" --rows "$rows" --files 4 --test-rows "$test_rows"
fi
mkdir -p "$logs"

# One job, in this shell (so the traps see it); sets `result` to
# "samples_per_s bytes_per_step calls_per_step auc teacher_auc rows".
result=
run_job() {
    local mode=$1 trainers=$2 servers=$3 log=$4 rc=0 heter=()
    # sync+heter: the dense part on a heter trainer (the same CPU, another process: what the
    # split costs; --heter-device emu or gpu puts it on a device).
    if [ "$mode" = sync+heter ]; then
        mode=sync heter=(--heter-trainers 1)
    fi
    "$oar" ps launch --servers "$servers" --trainers "$trainers" --mode "$mode" "${heter[@]}" \
        --table wide,sparse,dim=1,opt=adagrad,lr=0.2 --table emb,sparse,dim=8,opt=adagrad,lr=0.2 \
        --table dense,dense,opt=adam,lr=0.001 \
        -- "$ps_ctr" --data "$data" --batch "$batch" --heter-device cpu >"$log" 2>&1 &
    job=$!
    wait "$job" || rc=$?
    job=
    if [ "$rc" -ne 0 ]; then
        echo "bench/ps.sh: $mode, $trainers trainers, $servers servers failed (exit $rc); the end of $log:" >&2
        tail -n 30 "$log" >&2
        exit 1
    fi
    # Samples/s summed over trainers; bytes and calls per step averaged over them.
    result=$(awk -v want="$trainers" '
        /^ps_ctr trainer=/ {
            n++
            for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
            sps += v["samples_per_s"]; bytes += v["bytes_per_step"]; calls += v["calls_per_step"]
        }
        /^ps_ctr auc=/ {
            for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
            auc = v["auc"]; teacher = v["teacher_auc"]; rows = v["rows"]; got = 1
        }
        END {
            if (n != want || !got) {
                printf "bench/ps.sh: expected %d trainer lines and an AUC line, got %d and %d\n", want, n, got > "/dev/stderr"
                exit 1
            }
            printf "%.0f %.0f %.1f %s %s %s\n", sps, bytes / n, calls / n, auc, teacher, rows
        }' "$log") || { echo "bench/ps.sh: cannot parse $log" >&2; exit 1; }
}

# The median of each column of whitespace-separated rows on stdin.
medians() {
    awk '{ for (i = 1; i <= NF; i++) col[i, NR] = $i; if (NF > nf) nf = NF }
        END {
            for (i = 1; i <= nf; i++) {
                m = 0
                for (r = 1; r <= NR; r++) x[++m] = col[i, r]
                for (a = 2; a <= m; a++) { t = x[a]; b = a - 1; while (b >= 1 && x[b] + 0 > t + 0) { x[b + 1] = x[b]; b-- } x[b + 1] = t }
                med = (m % 2) ? x[(m + 1) / 2] : (x[m / 2] + x[m / 2 + 1]) / 2
                printf "%s%s", med, (i < nf ? " " : "\n")
            }
        }'
}

start=$SECONDS
table=$(mktemp)
configs=()
for mode in $modes; do
    for trainers in $trainer_counts; do
        for servers in $server_counts; do
            configs+=("$mode $trainers $servers")
        done
    done
done
if [ "${HETER:-1}" = 1 ]; then
    configs+=("sync+heter 1 2" "sync+heter 2 2")
fi
for config in "${configs[@]}"; do
    read -r mode trainers servers <<<"$config"
    results=
    for run in $(seq 1 "$runs"); do
        log=$logs/$mode-t$trainers-s$servers-run$run.log
        run_job "$mode" "$trainers" "$servers" "$log"
        line=$result
        echo "run $run: $mode, $trainers trainers, $servers servers:" \
            "samples/s, bytes/step, calls/step, auc, teacher auc, rows = $line ($((SECONDS - start)) s so far)"
        results+="$line"$'\n'
    done
    echo "$mode $trainers $servers $(printf '%s' "$results" | medians)" >>"$table"
done

echo
echo "rows $rows, batch $batch, medians of $runs runs; one epoch in total per job; $((SECONDS - start)) s"
echo "cpu: $cpu"
echo
echo "| mode | trainers | servers | samples/s (total) | bytes/step per trainer | calls/step | AUC | teacher AUC | rows materialised |"
echo "|---|---|---|---|---|---|---|---|---|"
awk '{ printf "| %s | %s | %s | %.0f | %.0f | %.1f | %.4f | %.4f | %.0f |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9 }' "$table"

