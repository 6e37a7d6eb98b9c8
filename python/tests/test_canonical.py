"""Canonical JSON and params hashes from Python equal Python's own `json.dumps`."""

from __future__ import annotations

import hashlib
import json
import math

import pytest

import tollgate


def python_canonical(doc) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


TRICKY = [
    {"floats": [0.1, 1.0, -0.0, 1e16, 1e-7, 1.5e300, 5e-324, 2.0**53, 123456789.123456789, 1e22, 1e21]},
    {"ints": [0, -1, 2**63, -(2**63) - 1, 2**127, 10**40, -(10**60), 2**200]},
    {"unicode": ["é", "日本語", "😀", "\u2028\u2029", "\x00\x1f\x7f", "\"\\/", "\ud7ff\ue000", "a\tb\nc\rd\x08e\x0c"]},
    {"é": 1, "e": 2, "z": 3, "A": 4, "😀": 5, "\u00ff": 6, "": 7, " ": 8},
    {"nested": {"b": [1, {"d": [], "c": {}}, [[[["deep"]]]]], "a": None, "t": True, "f": False}},
    {"tuple": (1, 2, "three"), "bool_is_not_int": [True, False, 1, 0]},
    [1, "array at the top", {"k": "v"}],
    "a string",
    3.141592653589793,
]


@pytest.mark.parametrize("doc", TRICKY, ids=range(len(TRICKY)))
def test_canonical_json_is_pythons_json_dumps(doc):
    expected = python_canonical(doc)
    assert tollgate.canonical_json(doc) == expected
    assert tollgate.canonical_hash(doc) == hashlib.sha256(expected.encode()).hexdigest()


def test_the_repositorys_canonical_fixture_hashes_as_python_does(data_dir):
    doc = json.loads((data_dir / "canonical" / "input.json").read_text())
    expected = python_canonical(doc)
    assert tollgate.canonical_json(doc) == expected
    assert tollgate.canonical_hash(doc) == hashlib.sha256(expected.encode()).hexdigest()


def test_subclasses_of_json_types_write_as_their_base_type():
    import enum

    class Color(str, enum.Enum):
        RED = "red"

    class Level(enum.IntEnum):
        HIGH = 3

    doc = {"c": Color.RED, "l": Level.HIGH, "big": Level.HIGH * 10**40}
    assert tollgate.canonical_json(doc) == python_canonical(doc)


@pytest.mark.parametrize("bad", [
    {"x": math.nan}, {"x": math.inf}, {"x": -math.inf},
    {1: "non-str key"}, {"x": object()}, {"x": b"bytes"}, {"x": {1, 2}},
    {"x": "\ud800"},
], ids=["nan", "inf", "-inf", "int-key", "object", "bytes", "set", "lone-surrogate"])
def test_what_has_no_canonical_form_is_a_value_error(bad):
    with pytest.raises(ValueError):
        tollgate.canonical_json(bad)
    with pytest.raises(ValueError):
        tollgate.canonical_hash(bad)


def test_nesting_is_bounded_and_a_cycle_is_an_error_not_a_crash():
    deep = current = {}
    for _ in range(1000):
        current["a"] = {}
        current = current["a"]
    with pytest.raises(ValueError, match="deeper"):
        tollgate.canonical_json(deep)
    cyclic = []
    cyclic.append(cyclic)
    with pytest.raises(ValueError, match="deeper"):
        tollgate.canonical_json(cyclic)
