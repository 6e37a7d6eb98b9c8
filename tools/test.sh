#!/usr/bin/env bash
# Every test of the project, Rust and Python, in one command: the README's test command,
# and what .ci/run calls once it has installed and started what a fresh machine lacks.
#
#   tools/test.sh
#
# What the tests need, and what happens without it:
#   cargo (a Rust toolchain)            required
#   Redis on 127.0.0.1:6379, and        the fleet tests (crates tollgate-redis and
#   PostgreSQL on 127.0.0.1:5432 with   tollgate-pg, the `fleet::` and `pg::` tests of the
#   trust auth and a database `test`,   tollgate binary); they also start private servers
#   redis-server and initdb binaries    of their own for restarts
#   chromium and chromedriver           the HITL console's browser test
#   python3 with venv and pip (PyPI     the Python package's suites (python/run-tests.sh)
#   reachable the first time)
#   protoc, strace                      two checks: sp1.proto under real protoc, and the
#                                       audit log's fsync order under strace
#
# Outside CI, whatever is missing is skipped LOUDLY: a `SKIPPED` line when the run starts
# and again at its end, and the last line says how many groups were skipped. With
# TOLLGATE_CI=1 (.ci/run sets it) anything missing is a failure before a test runs.
# The last line is `tests: N passed, M failed` (and `, K groups skipped` when any were);
# the exit code is non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."

ci=${TOLLGATE_CI:-0}
skipped=()
missing=()
note() { printf '\n== %s\n' "$*"; }
lack() {
  # lack WHAT CONSEQUENCE
  if [ "$ci" = 1 ]; then
    missing+=("$1")
  else
    skipped+=("$2 (missing: $1)")
  fi
}

command -v cargo >/dev/null || { echo "tools/test.sh: cargo not found: install a Rust toolchain (rustup)"; exit 2; }

# Both lock files must match their manifests (every build below is --locked): say so now,
# not after the Rust suite has run.
for m in Cargo.toml python/Cargo.toml; do
  if ! cargo metadata --locked --offline --format-version 1 --manifest-path "$m" >/dev/null 2>&1 &&
     ! cargo metadata --locked --format-version 1 --manifest-path "$m" >/dev/null 2>&1; then
    echo "tools/test.sh: the lock file of $m does not match it: run \`cargo generate-lockfile --offline --manifest-path $m\` (or cargo update -w) and commit it"
    exit 2
  fi
done

redis_up() {
  timeout 3 bash -c 'exec 3<>/dev/tcp/127.0.0.1/6379 && printf "PING\r\n" >&3 && head -c 5 <&3' 2>/dev/null | grep -q PONG
}
pg_up() {
  command -v psql >/dev/null &&
    psql -h 127.0.0.1 -p 5432 -U postgres -d test -w -Atc 'select 1' >/dev/null 2>&1
}

cargo_args=(--workspace --locked --no-fail-fast)
skip_args=()
fleet_needs=()
redis_up || fleet_needs+=("Redis on 127.0.0.1:6379")
pg_up || fleet_needs+=("PostgreSQL on 127.0.0.1:5432 (trust auth, database test)")
command -v redis-server >/dev/null || fleet_needs+=("redis-server")
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null ||
  fleet_needs+=("PostgreSQL's server binaries (initdb)")
fleet=1
if [ ${#fleet_needs[@]} -gt 0 ]; then
  fleet=0
  joined=$(printf '%s, ' "${fleet_needs[@]}")
  lack "${joined%, }" "the fleet tests"
fi
if [ "$fleet" = 0 ]; then
  cargo_args+=(--exclude tollgate-redis --exclude tollgate-pg)
  skip_args+=(--skip fleet:: --skip pg::)
fi

# Present tools are required by the tests that use them, so a broken one fails.
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  export TOLLGATE_REQUIRE_CHROMIUM=1
else
  lack "chromium and chromedriver" "the console's browser test"
fi
if command -v protoc >/dev/null && [ -f /usr/include/google/protobuf/empty.proto ]; then
  export TOLLGATE_REQUIRE_PROTOC=1
else
  lack "protoc (protobuf-compiler, libprotobuf-dev)" "sp1.proto under real protoc"
fi
if command -v strace >/dev/null; then
  export TOLLGATE_STORE_STRACE=1
else
  lack "strace" "the audit log's fsync-order test"
fi
python=1
python3 -c 'import venv, ensurepip' 2>/dev/null || { lack "python3 with venv and pip" "the Python suites"; python=0; }

if [ ${#missing[@]} -gt 0 ]; then
  printf 'tools/test.sh: TOLLGATE_CI=1 and missing: %s\n' "${missing[@]}"
  exit 2
fi
for s in "${skipped[@]}"; do printf '\n!! SKIPPED: %s\n' "$s"; done

out=$(mktemp)
pyout=$(mktemp)
trap 'rm -f "$out" "$pyout"' EXIT
status=0

note "rust: cargo test ${cargo_args[*]}${skip_args[*]:+ -- ${skip_args[*]}}"
cargo test "${cargo_args[@]}" -- "${skip_args[@]}" 2>&1 | tee "$out"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

if [ "$python" = 1 ]; then
  note "python: python/run-tests.sh"
  python/run-tests.sh 2>&1 | tee "$pyout"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  grep -Eq '^python: [1-9][0-9]* passed, 0 failed$' "$pyout" || { echo "python: no passing pytest run"; status=1; }
fi

for s in "${skipped[@]}"; do printf '!! SKIPPED: %s\n' "$s"; done
# cargo prints one result line per test binary; the Python suite `python: N passed, M failed`.
awk -v skipped=${#skipped[@]} '
  /^test result:/ { for (i = 1; i <= NF; i++) { if ($i == "passed;") p += $(i-1); if ($i == "failed;") f += $(i-1) } }
  /^python: [0-9]+ passed, [0-9]+ failed$/ { p += $2; f += $4 }
  END { printf "tests: %d passed, %d failed", p, f; if (skipped > 0) printf ", %d groups skipped", skipped; printf "\n" }' "$out" "$pyout"
exit "$status"
