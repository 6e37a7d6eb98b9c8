"""Daemon mode against a real `tollgate serve` in its own process: verdicts, settlement,
human decisions through the operator API, the fail-closed contract, resume, and that
waiting on the daemon blocks neither other threads (the GIL is released) nor the asyncio
loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

import tollgate
from conftest import DAEMON_CONFIG, wait_until_held


def connect(daemon, agent="bot", **kw):
    kw.setdefault("timeout", 30.0)
    return tollgate.connect(socket=daemon.socket, secret_file=daemon.secret_file, agent_id=agent, **kw)


def operator(daemon):
    return tollgate.operator(socket=daemon.socket, secret_file=daemon.operator_secret_file)


def test_verdicts_come_from_the_daemon(daemon):
    c = connect(daemon)
    got = []
    for _ in range(4):
        v = c.check("web_search", {"q": "rust"}, 0.002)
        got.append((v.verdict, v.reason))
        assert v.audit_entry_id and v.error is None
        if v.allowed:
            assert c.settle(v, 0.0015)
    assert got == [("ALLOW", "within_thresholds")] * 3 + [("DENY", "max_repeat_exceeded")]
    state = c.session_state()
    assert state["last_call_number"] == 4 and state["circuit_tripped"]
    assert state["budget_remaining_usd"] == pytest.approx(0.994)
    assert c.heartbeat() == pytest.approx(0.994)
    c.close()


def test_the_decorator_works_against_the_daemon(daemon):
    c = connect(daemon, "deco-bot")
    ran = []

    @c.tool(cost=0.4)
    def buy(item):
        ran.append(item)

    buy("a")
    buy("b")
    with pytest.raises(tollgate.ToolDenied) as e:
        buy("c")
    assert e.value.reason == "budget_overrun"
    assert ran == ["a", "b"]


def test_an_unreachable_daemon_is_a_connect_error_with_a_fail_closed_reason(tmp_path):
    with pytest.raises(tollgate.ConnectError) as e:
        tollgate.connect(socket=tmp_path / "nobody.sock", secret="x" * 32, agent_id="bot")
    assert e.value.args[0] == "fail_closed:daemon_unreachable"


def test_a_wrong_secret_is_refused(daemon):
    with pytest.raises(tollgate.ConnectError) as e:
        tollgate.connect(socket=daemon.socket, secret="wrong-secret-wrong-secret", agent_id="bot")
    assert e.value.args[0] == "fail_closed:authentication_failed"


def test_a_silent_daemon_is_a_deny_fail_closed_timeout(daemon):
    c = connect(daemon, "slow-bot", timeout=2.0, heartbeat_interval=0)
    daemon.pause()
    try:
        v = c.check("t", {"a": 1})
    finally:
        daemon.resume()
    assert (v.verdict, v.reason) == ("DENY", "fail_closed:timeout")
    assert v.budget_remaining_usd is None and "did not answer" in v.error


def test_a_session_resumes_where_it_left_off(daemon):
    c = connect(daemon, "resume-bot")
    c.check("t", {"a": 1})
    again = connect(daemon, "resume-bot", session_id=c.session_id)
    assert again.session_id == c.session_id
    assert again.check("t", {"a": 2}).call_number == 2


def test_an_agent_closes_its_session_and_it_cannot_be_resumed(daemon):
    c = connect(daemon, "closing-bot")
    assert c.check("t", {"a": 1}).allowed
    closed = c.close_session()
    assert closed["session_id"] == c.session_id
    assert closed["audit_entry_id"]
    # Nothing more is decided on it: every check is a DENY, a resume is refused.
    v = c.check("t", {"a": 2})
    assert not v.allowed
    with pytest.raises(tollgate.ConnectError) as e:
        connect(daemon, "closing-bot", session_id=c.session_id)
    assert e.value.args[0] == "fail_closed:session_not_found"
    with pytest.raises(tollgate.ConnectError):
        c.close_session()


def test_a_held_call_is_released_by_an_operators_approval(daemon):
    c = connect(daemon, "held-bot")
    op = operator(daemon)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", c.check_or_wait("pay", {"to": "acct"}, timeout=60)))
    t.start()
    pending = wait_until_held(op, c.session_id)
    assert pending["tool"] == "pay" and pending["params"] == {"to": "acct"}
    assert pending["held_reason"] == "hitl_all_calls"
    op.decide(c.session_id, "approve", operator="alice", note="ok")
    t.join()
    r = out["r"]
    assert r.allowed and r.decision == "approve" and r.params == {"to": "acct"}
    assert r.verdict.reason == "hitl_transition:approve"


def test_a_modified_call_comes_back_with_the_edited_params(daemon):
    # The decision is made before the agent asks for it (a modify while the agent waits:
    # test_grpc.py::test_a_modify_while_the_agent_awaits_over_grpc_runs_the_edited_call).
    c = connect(daemon, "held-bot")
    op = operator(daemon)
    held = c.check("pay", {"amount": 1000})
    assert held.held
    op.decide(c.session_id, "modify", operator="alice", params={"amount": 10})
    d = c.await_decision(held.call_number, timeout=5)
    assert d == {"outcome": "modify", "successor_params": {"amount": 10}, "note": ""}


def test_params_can_be_withheld_and_a_wait_can_give_up(daemon):
    c = connect(daemon, "held-bot")
    op = operator(daemon)
    # Nobody decides within the wait: DENY, and the call stays held on the daemon, with
    # its params never shown (the client would have sent them before it started waiting).
    r = c.check_or_wait("login", {"password": "hunter2"}, timeout=0.2, share_params=False)
    assert (r.verdict.verdict, r.reason, r.params) == ("DENY", "fail_closed:hitl_timeout", None)
    pending = wait_until_held(op, c.session_id, with_params=False)
    assert pending["tool"] == "login" and pending["params"] is None
    op.decide(c.session_id, "reject", operator="alice")
    assert c.await_decision(pending["call_number"], timeout=5)["outcome"] == "reject"


def test_waiting_on_the_daemon_releases_the_gil(daemon):
    # A thread's check waits on a paused daemon; this thread must keep running Python
    # (it resumes the daemon). If the GIL were held, the check would time out first.
    c = connect(daemon, "gil-bot", heartbeat_interval=0)
    daemon.pause()
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("v", c.check("t", {"a": 1})))
    t.start()
    spins = 0
    while spins < 100_000:  # Python work on this thread while the other one waits
        spins += 1
    daemon.resume()
    t.join()
    assert out["v"].reason == "within_thresholds"


def test_awaiting_the_daemon_does_not_block_the_event_loop(daemon):
    # The daemon is paused while `acheck` is awaited; a second task on the same loop
    # runs and resumes it. Were the loop blocked, the check would time out (DENY).
    c = connect(daemon, "async-bot", heartbeat_interval=0)

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            for _ in range(5):
                await asyncio.sleep(0)
                ticks += 1
            daemon.resume()

        daemon.pause()
        v, _ = await asyncio.gather(c.acheck("t", {"a": 1}), ticker())
        return v, ticks

    v, ticks = asyncio.run(main())
    assert ticks == 5 and v.reason == "within_thresholds"


def test_an_operator_decides_while_the_agent_awaits(daemon):
    c = connect(daemon, "held-bot")
    op = operator(daemon)

    async def main():
        async def human():
            await asyncio.to_thread(wait_until_held, op, c.session_id)
            op.decide(c.session_id, "approve", operator="alice")

        r, _ = await asyncio.gather(c.acheck_or_wait("pay", {"n": 1}, timeout=60), human())
        return r

    r = asyncio.run(main())
    assert r.allowed and r.decision == "approve"


def test_async_decorated_tools_against_the_daemon(daemon):
    c = connect(daemon, "async-deco", wait_for_human=False)
    ran = []

    @c.tool(cost=0.6)
    async def buy(item):
        ran.append(item)
        return item

    async def main():
        assert await buy("a") == "a"
        with pytest.raises(tollgate.ToolDenied):
            await buy("b")

    asyncio.run(main())
    assert ran == ["a"]


def test_the_daemon_example_runs(daemon):
    import pathlib
    import subprocess
    import sys

    example = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "daemon_client.py"
    out = subprocess.run([sys.executable, str(example), "--socket", str(daemon.socket),
                          "--secret-file", str(daemon.secret_file)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("results for sp/1.0") == 3
    assert "denied: max_repeat_exceeded" in out.stdout
    assert "async check: ALLOW within_thresholds" in out.stdout


EXIT_AFTER_LAST_AWAIT = """
import asyncio, os, signal, sys
import tollgate

sock, secret, pid = sys.argv[1], sys.argv[2], int(sys.argv[3])

async def main():
    c = tollgate.connect(socket=sock, secret_file=secret, agent_id="bot", timeout=5.0)
    r = await c.acheck_or_wait("search", {"q": 1}, timeout=5)
    assert r.allowed, r.verdict
    assert await c.asettle(r.verdict, 0.0)
    os.kill(pid, signal.SIGKILL)
    r = await c.acheck_or_wait("search", {"q": 2}, timeout=5)
    assert not r.allowed
    print("done", r.verdict.reason)

asyncio.run(main())
"""


def test_a_program_that_exits_right_after_its_last_await_exits_cleanly(tmp_path):
    """Issue 16 §6: await, settle, kill -9 the daemon, await again, exit. A native thread
    that completed the last await could still be holding the interpreter as it began to
    shut down ("PyGILState_Release: thread state ... must be current", 11 of 40 runs).
    20 runs here (each with a fresh daemon); tools/py-exit-soak.py runs 200."""
    import subprocess
    import sys

    from conftest import Daemon

    script = tmp_path / "exit_after_last_await.py"
    script.write_text(EXIT_AFTER_LAST_AWAIT)
    bad = []
    for i in range(20):
        d = Daemon(DAEMON_CONFIG)
        try:
            p = subprocess.run([sys.executable, str(script), str(d.socket), str(d.secret_file), str(d.proc.pid)],
                               capture_output=True, text=True, timeout=60)
            if p.returncode != 0 or "Fatal Python error" in p.stderr or "done fail_closed" not in p.stdout:
                bad.append((i, p.returncode, p.stdout[-300:], p.stderr[-600:]))
        finally:
            d.stop()
    assert bad == [], bad


def test_one_client_shared_by_threads_and_tasks_gets_each_held_call_decided_on_its_own(daemon):
    """Issue 16 §1: one client, shared by four threads (`check_or_wait`) and four asyncio
    tasks (`acheck_or_wait`), holds eight calls at once in one session. An operator names
    each by its call number and decides them in a shuffled order: every approved call is
    released with its own params, the modified one with the edited params only, the
    rejected ones never, with the human's note; the session's circuit stays closed and its
    budget pays for exactly what was released."""
    import random

    c = connect(daemon, "held-bot", heartbeat_interval=0)
    op = operator(daemon)
    plan = {
        0: ("approve", None, ""),
        1: ("reject", None, "too large"),
        2: ("modify", {"i": 102}, "smaller"),
        3: ("approve", None, ""),
        4: ("reject", None, "not this vendor"),
        5: ("approve", None, ""),
        6: ("modify", {"i": 106}, ""),
        7: ("approve", None, "ok"),
    }
    results = {}

    def in_thread(i):
        results[i] = c.check_or_wait("pay", {"i": i}, 0.01, timeout=120)

    async def in_tasks():
        async def one(i):
            results[i] = await c.acheck_or_wait("pay", {"i": i}, 0.01, timeout=120)

        await asyncio.gather(*(one(i) for i in range(4, 8)))

    workers = [threading.Thread(target=in_thread, args=(i,)) for i in range(4)]
    workers.append(threading.Thread(target=lambda: asyncio.run(in_tasks())))
    for w in workers:
        w.start()
    held = []
    for _ in range(100_000):
        held = [p for p in op.pending() if p["session_id"] == c.session_id and p["params"] is not None]
        if len(held) == len(plan):
            break
    assert sorted(p["params"]["i"] for p in held) == list(range(8)), held
    assert len({p["call_number"] for p in held}) == 8
    for p in random.Random(16).sample(held, len(held)):
        decision, params, note = plan[p["params"]["i"]]
        op.decide(c.session_id, decision, operator="alice", note=note, params=params,
                  call_number=p["call_number"])
    for w in workers:
        w.join()
    for i, (decision, params, note) in plan.items():
        r = results[i]
        assert r.decision == decision and r.note == note, (i, r, r.note)
        if decision == "reject":
            assert not r.allowed and r.reason == "hitl_transition:reject" and r.params is None
        else:
            assert r.allowed, (i, r)
            assert r.params == (params if decision == "modify" else {"i": i})
            assert c.settle(r.verdict, 0.01)
    state = c.session_state()
    assert not state["circuit_tripped"], state
    assert state["budget_remaining_usd"] == pytest.approx(1.0 - 0.01 * 6)
    # The session goes on: a later call is held for a human in turn, not refused.
    later = c.check("pay", {"i": 8}, 0.01)
    assert (later.verdict, later.reason) == ("HITL", "hitl_all_calls")


def test_an_operator_with_several_held_calls_must_name_one(daemon):
    c = connect(daemon, "held-bot", heartbeat_interval=0)
    op = operator(daemon)
    a = c.check("pay", {"i": 0})
    b = c.check("pay", {"i": 1})
    assert a.verdict == b.verdict == "HITL" and a.call_number != b.call_number
    with pytest.raises(tollgate.ConnectError):
        op.decide(c.session_id, "approve", operator="alice")  # which one?
    with pytest.raises(ValueError):
        op.decide(c.session_id, "approve", operator="alice", call_number=0)
    op.decide(c.session_id, "reject", operator="alice", note="no", call_number=b.call_number)
    assert c.await_decision(b.call_number, timeout=5) == {"outcome": "reject", "successor_params": None,
                                                           "note": "no"}
    assert c.await_decision(a.call_number, timeout=0)["outcome"] == "pending"
