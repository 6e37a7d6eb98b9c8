#!/usr/bin/env bash
# The servers' floor for one fleet decision, without Tollgate: the CPU Redis spends on
# what one decision sends it (the staging HSET of a record of RECORD bytes into a field of
# its own, then a script shaped like the compare-and-set, on names only: HGET v, HGET c, one
# HSET of v, c, d, the marker and p:<seq>, HGET of the dropped marker's p:, one HDEL of the
# marker, its p: and the record it names, PERSIST), plus the index's ZADD/ZREM beside it,
# and the CPU PostgreSQL spends per audit entry written as the journal writes them (one
# statement inserting BATCH entries and their claims, with the schema's keys, foreign keys
# and triggers, synchronous commit). Measured from /proc/PID/stat of the servers; other
# clients of a shared machine count too (run it on an idle one, or compare with a run of
# nothing).
#
# Usage: tools/fleet-floor.sh [RECORD=9000] [BATCH=20]
set -euo pipefail
record=${1:-9000}
batch=${2:-20}
tick=$(getconf CLK_TCK)
# shellcheck source=tools/lib/cpu.sh
. "$(dirname "$0")/lib/cpu.sh"

redis_pid=$(pgrep -o -x redis-server)
blob=$(head -c "$record" /dev/zero | tr '\0' x)
lua="local v = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
local cur = redis.call('HGET', KEYS[1], 'c') or 'b'
redis.call('HSET', KEYS[1], 'v', v + 1, 'c', ARGV[1], 'd', 'daemon-1', 'u:' .. (v + 1), '{\"at_ms\":1,\"seq\":1}', 'p:' .. (v + 1), cur)
local p = redis.call('HGET', KEYS[1], 'p:' .. v)
if p and p ~= ARGV[1] then redis.call('HDEL', KEYS[1], 'u:' .. v, 'p:' .. v, p) else redis.call('HDEL', KEYS[1], 'u:' .. v, 'p:' .. v) end
redis.call('PERSIST', KEYS[1])
return {1, v + 1, 0}"
sha=$(redis-cli script load "$lua")
n=40000
r0=$(cpu_of "$redis_pid")
# The staged record, then the script (64 sessions).
redis-benchmark -q -n "$n" -c 64 -r 64 hset "tgfloor:{s:__rand_int__}:s" "r:1" "$blob" >/dev/null
redis-benchmark -q -n "$n" -c 64 -r 64 evalsha "$sha" 1 "tgfloor:{s:__rand_int__}:s" "r:1" >/dev/null
redis-benchmark -q -n "$n" -c 64 -r 64 zadd tgfloor:unconfirmed 1 "m__rand_int__" >/dev/null
redis-benchmark -q -n "$n" -c 64 -r 64 zrem tgfloor:unconfirmed "m__rand_int__" >/dev/null
r1=$(cpu_of "$redis_pid")
redis-cli --scan --pattern 'tgfloor*' | xargs -r redis-cli del >/dev/null
echo "redis: $(echo "($r1 - $r0) / $tick * 1000000 / $n" | bc -l | xargs printf '%.1f') us of CPU per staged record + script call + ZADD + ZREM (record $record bytes, 64 clients)"

psql -qAt -U postgres -h 127.0.0.1 -d test 2>/dev/null <<SQL
DROP SCHEMA IF EXISTS tgfloor CASCADE;
CREATE SCHEMA tgfloor;
CREATE TABLE tgfloor.chains (chain_id text PRIMARY KEY);
CREATE TABLE tgfloor.entries (
    chain_id text NOT NULL REFERENCES tgfloor.chains (chain_id), idx bigint NOT NULL CHECK (idx >= 0),
    record bytea NOT NULL, entry_hash bytea NOT NULL, session_id text NULL, session_seq bigint NULL,
    kind smallint NOT NULL, written_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (chain_id, idx));
CREATE TABLE tgfloor.claims (
    session_id text NOT NULL, session_seq bigint NOT NULL, kind text NOT NULL CHECK (kind IN ('entry', 'void')),
    chain_id text NOT NULL, idx bigint NOT NULL, PRIMARY KEY (session_id, session_seq),
    FOREIGN KEY (chain_id, idx) REFERENCES tgfloor.entries (chain_id, idx) DEFERRABLE INITIALLY DEFERRED);
INSERT INTO tgfloor.chains VALUES ('c1'), ('c2'), ('c3');
CREATE SEQUENCE tgfloor.seq;
SQL
cat >/tmp/tgfloor.sql <<SQL
\set c random(1, 3)
SELECT nextval('tgfloor.seq') AS b \gset
WITH e AS (
  INSERT INTO tgfloor.entries (chain_id, idx, record, entry_hash, session_id, session_seq, kind)
  SELECT 'c' || :c, :b * $batch + g, decode(repeat('ab', 400), 'hex'), decode(repeat('cd', 32), 'hex'), 's' || (:b * $batch + g), 1, 3
  FROM generate_series(0, $batch - 1) g
)
INSERT INTO tgfloor.claims (session_id, session_seq, kind, chain_id, idx)
SELECT 's' || (:b * $batch + g), 1, 'entry', 'c' || :c, :b * $batch + g FROM generate_series(0, $batch - 1) g;
SQL
# Sample every postgres process while pgbench runs (its backends exit with it).
pgfile=$(mktemp)
pg_sampler_start "$pgfile"
out=$(pgbench -n -U postgres -h 127.0.0.1 -c 3 -j 1 -T 10 -f /tmp/tgfloor.sql test 2>&1)
pg_sampler_stop
pg=$(cat "$pgfile"); rm -f "$pgfile"
tx=$(echo "$out" | awk '/number of transactions actually processed/ {print $NF}' | cut -d/ -f1)
psql -qAt -U postgres -h 127.0.0.1 -d test -c "DROP SCHEMA tgfloor CASCADE" 2>/dev/null
rows=$((tx * batch))
echo "postgres: $rows entries in $tx statements of $batch in 10 s ($((rows / 10)) entries/s, 3 writers): $(echo "$pg / $tick * 1000000 / $rows" | bc -l | xargs printf '%.1f') us of CPU per entry (every postgres process: WAL writer and checkpointer included)"
