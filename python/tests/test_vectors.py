"""The 29 published SP/1.0 conformance vectors pass through the Python API."""

from __future__ import annotations

import copy
import json

import tollgate

FILES = ["conformance.json", "conformance-1.0.1.json"]


def fixtures(data_dir):
    out = []
    for name in FILES:
        out.extend(json.loads((data_dir / "sp1" / name).read_text())["fixtures"])
    return out


def test_all_29_published_vectors_pass_as_python_dicts(data_dir):
    vectors = fixtures(data_dir)
    assert len(vectors) == 29
    outcomes = [tollgate.check_vector(v) for v in vectors]
    assert [o.name for o in outcomes if not o.passed] == []
    for o in outcomes:
        assert (o.verdict, o.reason) == (o.expected_verdict, o.expected_reason)


def test_all_29_pass_from_the_files_text(data_dir):
    outcomes = []
    for name in FILES:
        outcomes += tollgate.run_vectors((data_dir / "sp1" / name).read_text())
    assert len(outcomes) == 29
    assert all(o.passed for o in outcomes), [repr(o) for o in outcomes if not o.passed]


def test_a_tampered_vector_fails_with_the_problem_named(data_dir):
    v = copy.deepcopy(fixtures(data_dir)[0])
    v["expected_reason"] = "budget_exhausted"
    o = tollgate.check_vector(v)
    assert not o.passed
    assert any("vector_hash mismatch" in p for p in o.problems)
    assert any("expected" in p and "got" in p for p in o.problems)


def test_an_unreadable_vector_is_a_failed_outcome_not_an_exception():
    o = tollgate.check_vector({"name": "broken", "config": 42})
    assert not o.passed and o.name == "broken"
    assert o.problems[0].startswith("invalid vector")
