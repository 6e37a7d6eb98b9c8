#!/usr/bin/env python3
"""Regenerate tests/data/canonical/: random documents and the bytes CPython's
json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False) writes for them.
The Rust test suite compares tollgate-core's canonical writer against these bytes, so the
suite itself needs no Python. Run from the repository root."""
import json, random, struct

random.seed(20261130)

def rand_float():
    k = random.random()
    if k < 0.4:
        f = struct.unpack("d", struct.pack("Q", random.getrandbits(64)))[0]
    elif k < 0.6:
        f = random.uniform(-1e6, 1e6)
    elif k < 0.8:
        f = random.choice([1, -1]) * 10 ** random.uniform(-30, 30)
    else:  # exact binary fractions: many are ties between two shortest decimals
        f = random.getrandbits(53) / 2 ** random.randint(0, 60)
    return f if f == f and abs(f) != float("inf") else 0.5

def rand_str():
    alphabet = ['a', 'Z', '"', '\\', '/', '\n', '\t', '\x00', '\x1f', '\x7f', 'é', '\u2028',
                '\uffff', '😀', ' ', '\b', '\f', '\r']
    return "".join(random.choice(alphabet) for _ in range(random.randint(0, 8)))

def rand_value(depth=0):
    k = random.random()
    if depth > 3 or k < 0.5:
        return random.choice([rand_float, rand_str,
                              lambda: random.randint(-10**30, 10**30),
                              lambda: random.choice([True, False, None])])()
    if k < 0.75:
        return [rand_value(depth + 1) for _ in range(random.randint(0, 4))]
    return {rand_str(): rand_value(depth + 1) for _ in range(random.randint(0, 4))}

floats = [rand_float() for _ in range(3000)]
docs = [rand_value() for _ in range(300)]
doc = {"floats": floats, "docs": docs}
with open("tests/data/canonical/input.json", "w", encoding="utf-8") as f:
    json.dump(doc, f, indent=1, ensure_ascii=True)
with open("tests/data/canonical/expected.json", "w", encoding="utf-8") as f:
    f.write(json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False))
