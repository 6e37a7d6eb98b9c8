#!/usr/bin/env bash
# CPU cost per decision of a fleet bench, by process kind: the bench and the daemons it
# starts (bash's `time` of the bench, which waits for its daemons: their CPU is counted),
# Redis (its /proc/PID/stat before and after) and PostgreSQL (every postgres process,
# sampled every 0.2 s so that backends which exit with the daemons are still counted;
# other clients of the same server count too). CPU time depends much less than throughput
# on what else the machine runs, so it is the figure to compare on a shared machine.
#
# Usage: tools/fleet-cpu.sh [tollgate bench arguments...]
#   tools/fleet-cpu.sh --daemons 3 --redis redis://127.0.0.1:6379/0 \
#     --postgres postgres://postgres@127.0.0.1:5432/test --sessions 64 --concurrency 64 --duration 10
# Prints the bench's report, then CPU-µs per decision of each kind and in total, and the
# ceiling that total puts on a 2-core machine (2e6 / total). Startup and shutdown of the
# daemons are included (a few ms each).
set -euo pipefail
bin=${TOLLGATE:-./target/release/tollgate}
tick=$(getconf CLK_TCK)
out=$(mktemp)
pgfile=$(mktemp)
timefile=$(mktemp)
trap 'rm -f "$out" "$pgfile" "$timefile"' EXIT

# shellcheck source=tools/lib/cpu.sh
. "$(dirname "$0")/lib/cpu.sh"
redis_pid=$(pgrep -o -x redis-server || true)
# What the servers spend without this bench (other clients of a shared machine), over
# ${IDLE:-5} s before it: subtracted, pro rata, from their figures ("net").
idle=${IDLE:-5}
ri0=0
[ -n "$redis_pid" ] && ri0=$(cpu_of "$redis_pid")
pi0=$(pg_total)
sleep "$idle"
ri1=0
[ -n "$redis_pid" ] && ri1=$(cpu_of "$redis_pid")
pi1=$(pg_total)
r0=$ri1
start=$(date +%s.%N)

pg_sampler_start "$pgfile"

TIMEFORMAT='%U %S'
{ time "$bin" bench "$@" >"$out"; } 2>"$timefile"
wall=$(echo "$(date +%s.%N) - $start" | bc)
sleep 0.3
pg_sampler_stop
cat "$out"
r1=0
[ -n "$redis_pid" ] && r1=$(cpu_of "$redis_pid")
pg=$(cat "$pgfile" 2>/dev/null || echo 0)
read -r bu bs < <(tail -1 "$timefile")
n=$(grep -oE 'requests [0-9]+' "$out" | head -1 | tr -dc '0-9')
rbg=$(echo "($ri1 - $ri0) * $wall / $idle" | bc -l)
pbg=$(echo "($pi1 - $pi0) * $wall / $idle" | bc -l)
awk -v tick="$tick" -v r=$((r1 - r0)) -v pg="$pg" -v rbg="$rbg" -v pbg="$pbg" -v b="$(echo "$bu + $bs" | bc)" -v n="${n:-0}" 'BEGIN {
    if (n == 0) { print "no decision count found"; exit 1 }
    rus = r / tick * 1e6 / n; pgus = pg / tick * 1e6 / n; bus = b * 1e6 / n;
    if (pbg < 0) pbg = 0
    rnet = (r - rbg) / tick * 1e6 / n; pnet = (pg - pbg) / tick * 1e6 / n
    t = bus + rus + pgus; tn = bus + rnet + pnet
    printf "cpu per decision: bench+daemons %.1f us, redis %.1f us, postgres %.1f us, total %.1f us (ceiling on 2 cores: %.0f decisions/s)\n", bus, rus, pgus, t, 2e6 / t
    printf "net of the servers background (measured before the run): redis %.1f us, postgres %.1f us, total %.1f us (ceiling %.0f decisions/s)\n", rnet, pnet, tn, 2e6 / tn
}'
