"""OpenAI Agents SDK: the real `Agent` and `Runner`, offline, with a scripted `Model`
that emits function calls."""

from __future__ import annotations

import asyncio
import json

import pytest

from agents import Agent, ModelResponse, Runner, Usage, function_tool, set_tracing_disabled
from agents.models.interface import Model
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

import tollgate
from tollgate.integrations.openai_agents import TollgateGuardrails

set_tracing_disabled(True)


class ScriptedModel(Model):
    """Answers each turn with the next scripted output: a function call, or final text."""

    def __init__(self, script):
        self.script = list(script)

    async def get_response(self, *args, **kwargs):
        item = self.script.pop(0) if self.script else "done"
        if isinstance(item, str):
            out = [ResponseOutputMessage(id="m", type="message", role="assistant", status="completed",
                                         content=[ResponseOutputText(type="output_text", text=item, annotations=[])])]
        else:
            # One function call, or a list of them: several tool calls in one response.
            out = [ResponseFunctionToolCall(id=call_id, call_id=call_id, type="function_call", name=name,
                                            arguments=json.dumps(args))
                   for call_id, name, args in (item if isinstance(item, list) else [item])]
        return ModelResponse(output=out, usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError


def make(guard, script, ran, cost=0.0):
    @function_tool
    def search(q: str) -> str:
        """Search the web."""
        ran.append(q)
        return f"results for {q}"

    tg = TollgateGuardrails(guard, cost=cost)
    agent = Agent(name="bot", instructions="", model=ScriptedModel(script), tools=[tg.protect(search)])
    return agent, tg


def script(*args_list):
    return [(f"call_{i}", "search", a) for i, a in enumerate(args_list)] + ["done"]


def tool_outputs(result):
    return [i.output for i in result.new_items if i.type == "tool_call_output_item"]


def test_an_allowed_call_runs_and_is_settled():
    guard = tollgate.Guard(budget_usd=1.0)
    ran = []
    agent, _ = make(guard, script({"q": "rust"}), ran, cost=0.25)
    result = Runner.run_sync(agent, "go")
    assert ran == ["rust"]
    assert tool_outputs(result) == ["results for rust"]
    assert result.final_output == "done"
    assert guard.budget_remaining_usd == 0.75


def test_a_repeated_call_is_rejected_with_the_reason_and_never_runs():
    guard = tollgate.Guard(max_repeat_calls=3)
    ran = []
    agent, _ = make(guard, script(*[{"q": "same"}] * 4), ran)
    result = Runner.run_sync(agent, "go")
    assert ran == ["same"] * 3
    assert "max_repeat_exceeded" in tool_outputs(result)[-1]


def test_a_budget_overrun_is_rejected():
    guard = tollgate.Guard(budget_usd=0.5)
    ran = []
    agent, _ = make(guard, script({"q": "a"}, {"q": "b"}), ran, cost=0.3)
    result = Runner.run_sync(agent, "go")
    assert ran == ["a"]
    assert "budget_overrun" in tool_outputs(result)[-1]


def test_a_held_call_interrupts_the_run_and_resumes_after_approval():
    guard = tollgate.Guard(hitl_mode="always")
    ran = []
    agent, tg = make(guard, script({"q": "pay"}), ran)
    first = Runner.run_sync(agent, "go")
    assert ran == []
    (item,) = first.interruptions
    state = first.to_state()
    tg.approve(state, item, operator="alice")
    done = Runner.run_sync(agent, state)
    assert ran == ["pay"]
    assert tool_outputs(done) == ["results for pay"]


def test_a_rejected_call_never_runs_and_is_recorded():
    guard = tollgate.Guard(hitl_mode="always")
    ran = []
    agent, tg = make(guard, script({"q": "x"}, {"q": "y"}), ran)
    first = Runner.run_sync(agent, "go")
    (item,) = first.interruptions
    held = list(tg._verdicts.values())
    assert [v.verdict for v in held] == ["HITL"]
    state = first.to_state()
    tg.reject(state, item, operator="bob")
    second = Runner.run_sync(agent, state)
    assert ran == []
    # A human's reject refuses that call only (several held calls: docs/protocol.md):
    # the model's next call is a call of its own, held for a human in turn, and the
    # session's circuit is not tripped.
    (next_item,) = second.interruptions
    assert json.loads(next_item.raw_item.arguments) == {"q": "y"}
    assert not guard.circuit_tripped
    # Tollgate recorded the rejection: the rejected call cannot be approved any more.
    with pytest.raises(ValueError):
        guard.resolve(held[0], "approve", operator="mallory")


def test_async_runs_are_guarded_too():
    guard = tollgate.Guard(max_repeat_calls=1)
    ran = []
    agent, _ = make(guard, script({"q": "a"}, {"q": "a"}), ran)
    result = asyncio.run(Runner.run(agent, "go"))
    assert ran == ["a"]
    assert "max_repeat_exceeded" in tool_outputs(result)[-1]


def test_the_example_runs():
    from _examples import run_example

    out = run_example("openai_agents_example.py")
    assert "search: results for sp/1.0" in out and "max_repeat_exceeded" in out


def test_an_operators_modify_never_runs_the_original_arguments(daemon):
    """Issue 16 §2: daemon mode, an operator modifies a held `pay` from 90.0 to 1.0. A
    guardrail cannot change the arguments the SDK runs, so the call is refused and the
    model told the changed arguments; the tool body never sees the original ones."""
    import threading

    from conftest import wait_until_held

    client = tollgate.connect(socket=daemon.socket, secret_file=daemon.secret_file, agent_id="held-bot",
                              timeout=30)
    op = tollgate.operator(socket=daemon.socket, secret_file=daemon.operator_secret_file)
    paid = []

    @function_tool
    def pay(amount: float) -> str:
        """Pay an amount."""
        paid.append(amount)
        return f"paid {amount}"

    tg = TollgateGuardrails(client)
    tg.hitl_timeout = 60
    agent = Agent(name="bot", instructions="", model=ScriptedModel([("call_0", "pay", {"amount": 90.0}), "done"]),
                  tools=[tg.protect(pay)])

    def modify_when_held():
        wait_until_held(op, client.session_id)
        op.decide(client.session_id, "modify", operator="alice", params={"amount": 1.0})

    t = threading.Thread(target=modify_when_held)
    t.start()
    result = Runner.run_sync(agent, "go")
    t.join()
    assert paid == [], f"the tool ran with {paid}"
    out = tool_outputs(result)
    assert len(out) == 1 and "changed the arguments" in out[0] and '{"amount":1.0}' in out[0], out


def make_payer(guard, script, paid, cost=0.0):
    @function_tool
    def pay(i: int) -> str:
        """Pay invoice i."""
        paid.append(i)
        return f"paid {i}"

    tg = TollgateGuardrails(guard, cost=cost)
    agent = Agent(name="bot", instructions="", model=ScriptedModel(script), tools=[tg.protect(pay)])
    return agent, tg


@pytest.mark.parametrize("n", [2, 6])
def test_several_held_calls_are_approved_and_rejected_one_by_one(n):
    """Issue 16 §1: a model response with n tool calls under HITL interrupts the run with
    n approvals; approving some and rejecting the others (in a shuffled order, with a
    note) runs each approved call exactly once and no rejected one, and the model reads
    the human's note."""
    import random

    guard = tollgate.Guard(hitl_mode="always")
    paid = []
    agent, tg = make_payer(guard, [[(f"c{i}", "pay", {"i": i}) for i in range(n)], "done"], paid, cost=0.01)
    first = Runner.run_sync(agent, "go")
    assert paid == []
    items = first.interruptions
    assert sorted(json.loads(it.raw_item.arguments)["i"] for it in items) == list(range(n))
    state = first.to_state()
    for it in random.Random(n).sample(items, len(items)):
        i = json.loads(it.raw_item.arguments)["i"]
        if i % 2:
            tg.reject(state, it, operator="bob", message=f"not invoice {i}")
        else:
            tg.approve(state, it, operator="alice")
    done = Runner.run_sync(agent, state)
    assert not done.interruptions
    assert sorted(paid) == [i for i in range(n) if i % 2 == 0]
    outs = tool_outputs(done)
    for i in range(n):
        if i % 2:
            assert any(f"not invoice {i}" in str(o) for o in outs), outs
        else:
            assert f"paid {i}" in outs
    assert not guard.circuit_tripped
    # Only what ran was charged; the rejected calls' reservations were given back.
    assert guard.budget_remaining_usd == pytest.approx(1.0 - 0.01 * len([i for i in range(n) if i % 2 == 0]))


def test_daemon_mode_several_held_calls_and_a_rejects_note(daemon):
    """Issue 16 §1, §5, daemon mode: three tool calls in one response, each waiting for
    its own operator decision (named by call number); the rejected one never runs and the
    model reads the operator's note; the modified one never runs with its original
    arguments."""
    import random
    import threading

    client = tollgate.connect(socket=daemon.socket, secret_file=daemon.secret_file, agent_id="held-bot",
                              timeout=30)
    op = tollgate.operator(socket=daemon.socket, secret_file=daemon.operator_secret_file)
    paid = []
    agent, tg = make_payer(client, [[(f"c{i}", "pay", {"i": i}) for i in range(3)], "done"], paid)
    tg.hitl_timeout = 120
    plan = {0: ("approve", None, ""), 1: ("reject", None, "duplicate invoice"), 2: ("modify", {"i": 102}, "")}

    def decide_all():
        for _ in range(100_000):
            pending = [p for p in op.pending() if p["session_id"] == client.session_id and p["params"] is not None]
            if len(pending) == 3:
                break
        for p in random.Random(1).sample(pending, len(pending)):
            d, params, note = plan[p["params"]["i"]]
            op.decide(client.session_id, d, operator="alice", params=params, note=note,
                      call_number=p["call_number"])

    t = threading.Thread(target=decide_all)
    t.start()
    result = Runner.run_sync(agent, "go")
    t.join()
    assert paid == [0], paid
    outs = [str(o) for o in tool_outputs(result)]
    assert any("duplicate invoice" in o and "hitl_transition:reject" in o for o in outs), outs
    assert any("changed the arguments" in o and '{"i":102}' in o for o in outs), outs


def test_a_call_held_behind_others_is_refused_not_approved():
    """Issue 16 §1: three calls in one response, a session that may hold two: the extra
    one needs no approval (nothing is held for it) and is refused with a text saying why;
    approving the two held ones runs exactly those."""
    guard = tollgate.Guard(hitl_mode="always", max_held_calls=2)
    paid = []
    agent, tg = make_payer(guard, [[(f"c{i}", "pay", {"i": i}) for i in range(3)], "done"], paid)
    first = Runner.run_sync(agent, "go")
    items = first.interruptions
    assert len(items) == 2
    state = first.to_state()
    for it in items:
        tg.approve(state, it, operator="alice")
    done = Runner.run_sync(agent, state)
    outs = [str(o) for o in tool_outputs(first) + tool_outputs(done)]
    assert len(paid) == 2, (paid, outs)
    assert any("held behind other calls" in o and "Call it again" in o for o in outs), outs


POLICY_STEPS = [("shell", {"command": "ls"}), ("shell", {"command": "rm -rf /"}), ("delete_repo", {"name": "prod"}),
                ("crm_lookup", {"customer": 7}),
                ("send_email", {"to": "partner@elsewhere.example", "body": "the customer's data"}),
                ("pay", {"amount": 250.5, "to": "shop"})]


def make_policy_agent(guard, ran):
    """Issue 18's calls (conftest.py's rules), one per turn, each tool recording its runs."""

    @function_tool
    def shell(command: str) -> str:
        """Run a shell command."""
        ran.append(("shell", command))
        return "ok"

    @function_tool
    def delete_repo(name: str) -> str:
        """Delete a repository."""
        ran.append(("delete_repo", name))
        return "deleted"

    @function_tool
    def crm_lookup(customer: int) -> str:
        """Look a customer up."""
        ran.append(("crm_lookup", customer))
        return "customer 7"

    @function_tool
    def send_email(to: str, body: str) -> str:
        """Send an e-mail."""
        ran.append(("send_email", to))
        return "sent"

    @function_tool
    def pay(amount: float, to: str) -> str:
        """Pay an amount."""
        ran.append(("pay", amount))
        return f"paid {amount}"

    tg = TollgateGuardrails(guard)
    tg.hitl_timeout = 60
    agent = Agent(name="bot", instructions="",
                  model=ScriptedModel([(f"c{i}", n, a) for i, (n, a) in enumerate(POLICY_STEPS)] + ["done"]),
                  tools=[tg.protect(f) for f in (shell, delete_repo, crm_lookup, send_email, pay)])
    return agent, tg


def check_policy_outputs(outs):
    assert len(outs) == 6, outs
    for i, reason in [(1, "policy:shell-commands"), (2, "policy_default_deny"),
                      (4, "policy:mail-out-after-customer-data")]:
        assert reason in outs[i], outs
    assert outs[5] == "paid 250.5", outs


def test_daemon_mode_policies_refuse_and_hold(policy_daemon):
    """Issue 18 over the guardrails: each refused call is rejected with the policy's
    reason and its body never runs; the held payment runs once an operator approves it."""
    import threading

    from conftest import wait_until_held

    client = tollgate.connect(socket=policy_daemon.socket, secret_file=policy_daemon.secret_file,
                              agent_id="oa-policy", timeout=30)
    op = tollgate.operator(socket=policy_daemon.socket, secret_file=policy_daemon.operator_secret_file)
    ran = []
    agent, _ = make_policy_agent(client, ran)

    def approve():
        p = wait_until_held(op, client.session_id)
        assert p["tool"] == "pay" and p["held_reason"] == "policy_hold"
        op.decide(client.session_id, "approve", operator="alice", call_number=p["call_number"])

    t = threading.Thread(target=approve)
    t.start()
    result = Runner.run_sync(agent, "go")
    t.join()
    assert ran == [("shell", "ls"), ("crm_lookup", 7), ("pay", 250.5)], ran
    check_policy_outputs([str(o) for o in tool_outputs(result)])
    assert not client.session_state()["circuit_tripped"]


def test_library_mode_policies_refuse_and_need_approval(tmp_path):
    """Issue 18 with `Guard(policy=...)`: the refused calls never run; the `@hitl` payment
    is the SDK's approval item, and runs once approved."""
    import textwrap

    from conftest import POLICY_FLOWS, POLICY_TOOLS

    (tmp_path / "tools.cedar").write_text(textwrap.dedent(POLICY_TOOLS))
    (tmp_path / "flows.cedar").write_text(textwrap.dedent(POLICY_FLOWS))
    guard = tollgate.Guard(policy={"files": [str(tmp_path / "tools.cedar"), str(tmp_path / "flows.cedar")],
                                   "default": "deny"})
    ran = []
    agent, tg = make_policy_agent(guard, ran)
    first = Runner.run_sync(agent, "go")
    (item,) = first.interruptions
    assert json.loads(item.raw_item.arguments) == {"amount": 250.5, "to": "shop"}
    assert ran == [("shell", "ls"), ("crm_lookup", 7)], ran
    state = first.to_state()
    tg.approve(state, item, operator="alice")
    done = Runner.run_sync(agent, state)
    assert ran == [("shell", "ls"), ("crm_lookup", 7), ("pay", 250.5)], ran
    # The resumed run's items are the whole run's.
    check_policy_outputs([str(o) for o in tool_outputs(done)])
