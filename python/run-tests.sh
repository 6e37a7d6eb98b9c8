#!/usr/bin/env bash
# The Python suite: build the `tollgate` wheel once (pip, with maturin as its build
# backend), install it into one virtualenv per framework (their pins conflict: CrewAI
# needs openai<3, the OpenAI Agents SDK openai>=3), and run pytest in each:
#   core           python/tests/*.py (no framework)
#   langchain      python/tests/integrations/test_langchain.py
#   openai_agents  python/tests/integrations/test_openai_agents.py
#   autogen        python/tests/integrations/test_autogen.py
#   crewai         python/tests/integrations/test_crewai.py
# Each virtualenv is installed from python/ci/<name>.txt and kept in
# $TOLLGATE_PY_CACHE (default /var/cache/tollgate-ci when writable) under a name that
# includes the hash of that file and the Python version, so a later run on the same
# machine reuses it; without the cache everything is installed afresh.
# Usage: python/run-tests.sh [SUITE...]   (default: all five)
# The last line is `python: N passed, M failed`; the exit code is non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
PY=${PYTHON:-python3}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$repo/target}
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(core langchain openai_agents autogen crewai)

cache=${TOLLGATE_PY_CACHE:-/var/cache/tollgate-ci}
if ! mkdir -p "$cache/venvs" 2>/dev/null || [ ! -w "$cache/venvs" ]; then
  cache=$(mktemp -d)
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

log() { printf '\n== %s\n' "$*"; }
now() { date +%s; }

log "python: the tollgate binary for the daemon tests"
cargo build -p tollgate --locked --quiet
export TOLLGATE_BIN=$CARGO_TARGET_DIR/debug/tollgate

log "python: native module checks (fmt, clippy, doc)"
cargo fmt --manifest-path python/Cargo.toml -- --check
PYO3_PYTHON=$PY cargo clippy --manifest-path python/Cargo.toml --locked --all-targets --quiet -- -D warnings
PYO3_PYTHON=$PY RUSTDOCFLAGS="-D warnings" cargo doc --manifest-path python/Cargo.toml --locked --no-deps --quiet

log "python: building the wheel (pip wheel ./python, dev profile)"
t0=$(now)
# The dev profile (as the Rust suite's, whose dependencies it shares in the same target
# directory) builds in a fraction of a release build's time; the tests check behaviour,
# not speed. A release wheel is what `pip install ./python` (or maturin build --release)
# makes for users.
MATURIN_PEP517_ARGS="--profile dev" "$PY" -m pip wheel --quiet --disable-pip-version-check --no-deps ./python -w "$work/wheel"
wheel=$(ls "$work"/wheel/tollgate-*.whl)
echo "built $(basename "$wheel") in $(( $(now) - t0 )) s"

pyver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
frozen() { "$1/bin/pip" freeze --disable-pip-version-check 2>/dev/null | grep -v '^tollgate[= @]' || true; }
venv_for() {
  local name=$1 req=python/ci/$1.txt key dir t
  key=$( (cat "$req"; echo "$pyver") | sha256sum | cut -c1-16)
  dir=$cache/venvs/$name-$key
  # An empty .complete was written by an earlier version of this script: adopt the venv
  # once, recording what it holds, if it imports pytest.
  if [ -f "$dir/.complete" ] && [ ! -s "$dir/.complete" ] && "$dir/bin/python" -c 'import pytest' 2>/dev/null; then
    frozen "$dir" >"$dir/.complete"
  fi
  # A venv is reused only when it was finished and holds exactly what it held then
  # (.complete records its `pip freeze`): a run killed mid-install, or a venv changed
  # since, is installed afresh.
  if [ -f "$dir/.complete" ] && "$dir/bin/python" -c 'import pytest' 2>/dev/null \
    && [ "$(frozen "$dir")" = "$(cat "$dir/.complete")" ]; then
    echo "reusing $dir" >&2
  else
    t=$(now)
    rm -rf "$dir"
    "$PY" -m venv "$dir"
    "$dir/bin/pip" install --quiet --disable-pip-version-check -r "$req" >&2
    "$dir/bin/python" -c 'import pytest' || { echo "python: $name venv has no pytest after install" >&2; exit 1; }
    frozen "$dir" >"$dir/.complete"
    echo "installed $name in $(( $(now) - t )) s ($(du -sm "$dir" | cut -f1) MB)" >&2
  fi
  "$dir/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps "$wheel" >&2
  echo "$dir"
}

passed=0 failed=0 status=0
for s in "${suites[@]}"; do
  case $s in
    core) targets=(python/tests --ignore=python/tests/integrations) ;;
    langchain|openai_agents|autogen|crewai) targets=("python/tests/integrations/test_$s.py") ;;
    *) echo "unknown suite $s"; exit 2 ;;
  esac
  log "python: $s"
  # One run at a time per suite's virtualenv: two runs on one machine (a developer's and
  # CI's) would otherwise install into, or reinstall the wheel under, each other's venv.
  exec {lock}>"$cache/venvs/$s.lock"
  flock "$lock"
  dir=$(venv_for "$s")
  out="$work/$s.out"
  set +e
  # From the repository root with the venv's own pytest, so `import tollgate` is the
  # installed wheel, never the source folder.
  CREWAI_DISABLE_TELEMETRY=true OTEL_SDK_DISABLED=true \
    "$dir/bin/pytest" -q -p no:cacheprovider -W ignore::DeprecationWarning "${targets[@]}" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  set -e
  exec {lock}>&-
  p=$(grep -Eo '[0-9]+ passed' "$out" | tail -1 | cut -d' ' -f1 || true)
  f=$( (grep -Eo '[0-9]+ (failed|error|errors)' "$out" || true) | awk '{ n += $1 } END { print n + 0 }')
  passed=$((passed + ${p:-0})); failed=$((failed + f))
  # pytest's exit 5 (no tests collected) is a failure here too, and so is a suite that
  # exits 0 having passed nothing.
  [ "$rc" -eq 0 ] || { status=1; [ "$f" -gt 0 ] || failed=$((failed + 1)); }
  [ "${p:-0}" -gt 0 ] || { echo "python: suite $s passed no test"; status=1; [ "$rc" -ne 0 ] || failed=$((failed + 1)); }
done
printf 'python: %d passed, %d failed\n' "$passed" "$failed"
exit "$status"
