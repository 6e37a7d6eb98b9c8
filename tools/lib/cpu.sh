# CPU-time sampling shared by tools/fleet-cpu.sh and tools/fleet-floor.sh (sourced, not
# run). Figures are in clock ticks (getconf CLK_TCK) of user + system time.

# The CPU ticks process PID has used so far (0 if it is gone).
cpu_of() { awk '{print $14+$15}' "/proc/$1/stat" 2>/dev/null || echo 0; }

# The CPU ticks every process of user postgres has used so far.
pg_total() { local t=0 p; for p in $(pgrep -u postgres || true); do t=$((t + $(cpu_of "$p"))); done; echo "$t"; }

# Start sampling every postgres process in the background, every 0.2 s, so that backends
# which exit before the end (with their clients) are still counted: FILE always holds the
# ticks they used since the start (a process born meanwhile counts from 0). Sets
# pg_sampler to the sampler's pid; stop it with pg_sampler_stop.
pg_sampler_start() {
    local file=$1
    (
        declare -A first last
        for p in $(pgrep -u postgres || true); do first[$p]=$(cpu_of "$p"); done
        while :; do
            for p in $(pgrep -u postgres || true); do
                c=$(cpu_of "$p")
                [ -z "${first[$p]:-}" ] && first[$p]=0
                last[$p]=$c
            done
            t=0
            for p in "${!last[@]}"; do t=$((t + last[$p] - first[$p])); done
            echo "$t" >"$file"
            sleep 0.2
        done
    ) &
    pg_sampler=$!
}

pg_sampler_stop() {
    kill "$pg_sampler" 2>/dev/null || true
    wait "$pg_sampler" 2>/dev/null || true
}
