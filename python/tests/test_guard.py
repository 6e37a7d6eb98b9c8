"""Library mode: `tollgate.Guard`, its verdicts, settlements, human decisions, the
`@guard.tool` decorator and the local audit log."""

from __future__ import annotations

import asyncio
import math
import subprocess
import threading

import pytest

import tollgate
from conftest import tollgate_bin


def test_appendix_a_through_the_python_api():
    g = tollgate.Guard(budget_usd=0.5, max_repeat_calls=3)
    got = []
    for _ in range(4):
        v = g.check("web_search", {"q": "rust"}, 0.002)
        got.append((v.verdict, v.reason, v.budget_remaining_usd))
        if v.allowed:
            s = g.settle(v, 0.0015)
            assert s.charged_usd == 0.002 and not s.cost_unreadable
    assert got == [
        ("ALLOW", "within_thresholds", 0.498),
        ("ALLOW", "within_thresholds", 0.496),
        ("ALLOW", "within_thresholds", 0.494),
        ("DENY", "max_repeat_exceeded", 0.494),
    ]
    assert g.circuit_tripped
    assert g.check("other", {}).reason == "circuit_open"


def test_a_verdict_says_everything_about_the_call():
    g = tollgate.Guard(budget_usd=1.0)
    params = {"q": "x"}
    v = g.check("search", params, 0.25)
    assert v.allowed and bool(v) and not v.held
    assert v.call_number == 1 and v.nonce > 0
    assert v.tool == "search" and v.params is params and v.estimated_cost_usd == 0.25
    assert v.budget_remaining_usd == 0.75 and v.deny_reason is None
    d = g.check("search", {"q": "y"}, 5.0)
    assert (d.verdict, d.reason, d.deny_reason, bool(d)) == ("DENY", "budget_overrun", "BUDGET_EXHAUSTED", False)


@pytest.mark.parametrize("params, cost", [
    ([1, 2], 0.0), ("text", 0.0), ({"x": math.nan}, 0.0), ({1: "int key"}, 0.0),
    ({"x": object()}, 0.0), ({"q": "ok"}, -1.0), ({"q": "ok"}, math.inf),
], ids=["array", "string", "nan", "int-key", "object", "negative-cost", "infinite-cost"])
def test_params_or_cost_without_a_canonical_form_are_denied_as_malformed(params, cost):
    g = tollgate.Guard()
    v = g.check("t", params, cost)
    assert (v.verdict, v.reason) == ("DENY", "policy_violation:malformed_input")


def test_opaque_context_goes_to_a_human():
    v = tollgate.Guard().check("t", {"ctx": "Unknown "})
    assert (v.verdict, v.reason) == ("HITL", "fail_closed:opaque_context")


def test_settle_without_a_cost_charges_the_estimate():
    g = tollgate.Guard(budget_usd=1.0, settlement="actual")
    v = g.check("t", {"a": 1}, 0.1)
    s = g.settle(v)
    assert s.charged_usd == 0.1 and not s.cost_unreadable
    v2 = g.check("t", {"a": 2}, 0.1)
    s2 = g.settle(v2.call_number)  # a bare number: the reservation's estimate, unreadable
    assert s2.charged_usd == 0.1 and s2.cost_unreadable
    with pytest.raises(TypeError):
        g.settle("not a call")


def test_resolve_approve_releases_the_held_call_once():
    g = tollgate.Guard(hitl_mode="always")
    params = {"to": "acct_1"}
    held = g.check("pay", params)
    assert held.held and held.reason == "hitl_all_calls"
    r = g.resolve(held, "approve", operator="alice")
    assert r.allowed and r.decision == "approve" and r.params is params
    assert r.verdict.reason == "hitl_transition:approve" and r.verdict.nonce == held.nonce
    with pytest.raises(ValueError, match="cannot be recorded"):
        g.resolve(held, "approve", operator="alice")
    replay = g.check("pay", params, nonce=held.nonce)
    assert replay.reason == "policy_violation:duplicate_nonce"


def test_resolve_modify_runs_only_the_edited_call():
    g = tollgate.Guard(hitl_mode="always")
    held = g.check("pay", {"amount": 1000})
    r = g.resolve(held, "modify", operator="alice", params={"amount": 10})
    assert r.allowed and r.params == {"amount": 10}
    assert r.verdict.reason == "hitl_transition:modify_successor"


def test_resolve_reject_and_bad_decisions():
    g = tollgate.Guard(hitl_mode="always")
    held = g.check("pay", {"a": 1})
    with pytest.raises(ValueError, match="unknown decision"):
        g.resolve(held, "maybe", operator="x")
    with pytest.raises(ValueError, match="successor"):
        g.resolve(held, "modify", operator="x")
    r = g.resolve(held, "reject", operator="bob")
    assert not r.allowed and r.reason == "hitl_transition:reject" and r.params is None


def test_the_decorator_runs_allowed_calls_and_settles_their_cost():
    g = tollgate.Guard(budget_usd=1.0, settlement="actual")
    calls = []

    @g.tool(cost=0.5, cost_of=lambda result: result / 100)
    def fetch(url, retries=2):
        calls.append((url, retries))
        return 10

    assert fetch("a") == 10
    assert calls == [("a", 2)]
    assert g.budget_remaining_usd == pytest.approx(0.9)


def test_the_decorator_raises_tool_denied_and_never_runs_the_body():
    g = tollgate.Guard(max_repeat_calls=2)
    ran = []

    @g.tool
    def search(q):
        ran.append(q)

    search("x")
    search("x")
    with pytest.raises(tollgate.ToolDenied) as e:
        search("x")
    assert e.value.reason == "max_repeat_exceeded" and e.value.tool == "search"
    assert ran == ["x", "x"]


def test_the_decorator_raises_held_for_human_without_a_handler():
    g = tollgate.Guard(hitl_mode="always")

    @g.tool
    def pay(amount):
        raise AssertionError("must not run")

    with pytest.raises(tollgate.HeldForHuman) as e:
        pay(5)
    assert e.value.verdict.held
    # The held call can still be released, and returns the params to run with.
    assert g.resolve(e.value.verdict, "approve", operator="alice").params == {"amount": 5}


def test_the_decorator_asks_on_hitl_and_runs_the_modified_call():
    g = tollgate.Guard(hitl_mode="always",
                       on_hitl=lambda v: tollgate.Decision("modify", operator="alice", params={"amount": 1}))
    paid = []

    @g.tool
    def pay(amount):
        paid.append(amount)
        return amount

    assert pay(1000) == 1
    assert paid == [1]


def test_a_failing_tool_is_reported_and_reraised():
    g = tollgate.Guard(budget_usd=1.0)

    @g.tool(cost=0.2)
    def flaky():
        raise TimeoutError("HTTP 429 rate limit")

    with pytest.raises(TimeoutError):
        flaky()
    assert g.budget_remaining_usd == pytest.approx(0.8)


def test_async_functions_are_guarded():
    g = tollgate.Guard(max_repeat_calls=1)
    ran = []

    @g.tool
    async def search(q):
        ran.append(q)
        return q

    async def main():
        assert await search("a") == "a"
        with pytest.raises(tollgate.ToolDenied):
            await search("a")

    asyncio.run(main())
    assert ran == ["a"]


def test_a_guard_is_safe_to_share_between_threads():
    g = tollgate.Guard(budget_usd=100.0, max_repeat_calls=0)
    per_thread = 200
    numbers = []
    lock = threading.Lock()

    def work(t):
        for i in range(per_thread):
            v = g.check("t", {"thread": t, "i": i}, 0.01)
            assert v.allowed
            with lock:
                numbers.append(v.call_number)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(numbers) == list(range(1, 8 * per_thread + 1))
    assert g.calls == 8 * per_thread
    assert g.budget_remaining_usd == pytest.approx(100.0 - 8 * per_thread * 0.01)


def test_bad_configuration_is_a_value_error():
    with pytest.raises(ValueError, match="hitl_mode"):
        tollgate.Guard(hitl_mode="sometimes")
    with pytest.raises(ValueError, match="budget_usd"):
        tollgate.Guard(budget_usd=-1.0)
    with pytest.raises(ValueError, match="audit_key"):
        tollgate.Guard(audit_log="/tmp/nowhere")


def test_the_local_audit_log_verifies_with_the_public_key(tmp_path):
    subprocess.run([tollgate_bin(), "keygen", "--out", str(tmp_path)], check=True, capture_output=True)
    log = tmp_path / "audit"
    g = tollgate.Guard(max_repeat_calls=3, audit_log=log, audit_key=tmp_path / "audit.key",
                       session_id="py-1", agent_id="bot")
    for _ in range(4):
        v = g.check("t", {"q": 1}, 0.01)
        if v.allowed:
            assert g.settle(v, 0.01).audited
    del g
    out = subprocess.run([tollgate_bin(), "audit", "verify", "--key", str(tmp_path / "audit.pub"), str(log)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    export = subprocess.run([tollgate_bin(), "audit", "export", "--format", "jsonl", str(log)],
                            capture_output=True, text=True, check=True).stdout
    assert export.count("max_repeat_exceeded") == 1
    assert export.count("within_thresholds") == 3


def test_the_decorator_checks_the_arguments_by_name_with_defaults():
    g = tollgate.Guard(hitl_mode="always")

    @g.tool
    def f(a, b=2, *, c="x"):
        raise AssertionError("held calls never run")

    @g.tool
    def v(a, *rest, **extra):
        raise AssertionError("held calls never run")

    def params_of(fn, *args, **kwargs):
        with pytest.raises(tollgate.HeldForHuman) as e:
            fn(*args, **kwargs)
        return e.value.verdict.params

    expected = {"a": 1, "b": 2, "c": "x"}
    assert params_of(f, 1) == expected
    assert params_of(f, a=1) == expected
    assert params_of(f, 1, 2, c="x") == expected
    assert list(params_of(f, c="x", b=2, a=1)) == ["a", "b", "c"]
    assert params_of(v, 1, 2, 3, k=4) == {"a": 1, "rest": (2, 3), "extra": {"k": 4}}
    for bad in [lambda: f(), lambda: f(1, 2, 3), lambda: f(1, a=1), lambda: f(1, d=4)]:
        with pytest.raises(TypeError):
            bad()


def test_an_on_hitl_in_async_code_never_blocks_the_event_loop():
    """Issue 16 §6: a 1 s `on_hitl` froze AutoGen's loop. Here each handler approves only
    if the loop ran while it waited (another task sets the event it waits on); a handler
    that blocked the loop would time out and reject. No timing threshold: the handlers
    wait on events, not clocks."""

    def sync_handler_factory(ran: threading.Event):
        def handler(verdict):
            return "approve" if ran.wait(timeout=30) else "reject"
        return handler

    async def main():
        # A plain (blocking) handler: run off the loop.
        ran = threading.Event()
        g = tollgate.Guard(hitl_mode="always", on_hitl=sync_handler_factory(ran))
        calls = []

        @g.tool
        async def pay(n):
            calls.append(n)
            return n

        async def loop_runs():
            await asyncio.sleep(0)
            ran.set()

        r, _ = await asyncio.gather(pay(1), loop_runs())
        assert r == 1 and calls == [1]

        # An async handler: awaited.
        loop_ran = asyncio.Event()

        async def ahandler(verdict):
            await asyncio.wait_for(loop_ran.wait(), timeout=30)
            return tollgate.Decision("approve", operator="async-human")

        g2 = tollgate.Guard(hitl_mode="always", on_hitl=ahandler)

        @g2.tool
        async def pay2(n):
            calls.append(n)
            return n

        async def set_later():
            await asyncio.sleep(0)
            loop_ran.set()

        r, _ = await asyncio.gather(pay2(2), set_later())
        assert r == 2 and calls == [1, 2]

    asyncio.run(main())


def test_an_async_on_hitl_works_from_sync_code_too():
    async def ahandler(verdict):
        await asyncio.sleep(0)
        return "approve"

    g = tollgate.Guard(hitl_mode="always", on_hitl=ahandler)

    @g.tool
    def pay(n):
        return n

    assert pay(3) == 3


def test_a_human_note_comes_back_with_the_decision():
    g = tollgate.Guard(hitl_mode="always")
    a = g.check("pay", {"i": 0})
    b = g.check("pay", {"i": 1})
    r = g.resolve(b, "reject", operator="alice", note="over the limit")
    assert (r.allowed, r.reason, r.note) == (False, "hitl_transition:reject", "over the limit")
    assert g.resolve(a, "approve", operator="alice").note == ""
    with pytest.raises(ValueError):
        g.resolve(g.check("pay", {"i": 2}), "reject", operator="alice", note="x" * 1025)

    @tollgate.Guard(hitl_mode="always", on_hitl=lambda v: tollgate.Decision("reject", note="not today")).tool
    def pay(i):
        raise AssertionError("never runs")

    with pytest.raises(tollgate.ToolDenied) as e:
        pay(1)
    assert e.value.note == "not today" and "not today" in str(e.value)
