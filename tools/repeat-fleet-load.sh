#!/usr/bin/env bash
# Run the fleet load test (three `tollgate serve` daemons on the Redis at 127.0.0.1:6379 and
# the PostgreSQL at 127.0.0.1:5432, 200 agents, a kill -9 mid-load; issue 15 §1) N times
# in a row, stopping at the first failure. Builds the test binary once, then runs it
# directly, so each run is the test alone. Prints one line per run (its wall time) and a
# last line `fleet load: N of N runs passed` (exit 0) or the failing run's output and
# `fleet load: run K of N failed` (exit 1).
#
# Usage: tools/repeat-fleet-load.sh [N=10]
# The build honours CARGO_TARGET_DIR; prefix `nice -n 10` on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-10}
test=fleet::three_daemons_share_one_budget_without_overspending_then_one_is_killed

# The test binary (target/…/deps/cli-<hash>), not the tollgate binary it runs.
bin=$(cargo test -p tollgate --test cli --locked --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*\/deps\/cli-[^"]*\)".*/\1/p' | tail -1)
[ -x "$bin" ] || { echo "repeat-fleet-load: the cli test binary did not build"; exit 2; }

log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
for i in $(seq 1 "$n"); do
  t0=$(date +%s.%N)
  # As cargo runs it: from the package directory.
  if (cd crates/tollgate && "$bin" --exact "$test" --test-threads 1 --nocapture) >"$log" 2>&1 &&
    grep -q '^test result: ok. 1 passed' "$log"; then
    printf 'run %d of %d: ok in %.1f s\n' "$i" "$n" "$(echo "$(date +%s.%N) - $t0" | bc -l)"
    grep -oE '(no fault|kill -9): .*' "$log" | sed 's/^/  /'
  else
    cat "$log"
    echo "fleet load: run $i of $n failed"
    exit 1
  fi
done
echo "fleet load: $n of $n runs passed in $(($(date +%s) - start)) s"
