"""LangChain v1 / LangGraph: the real `create_agent` and `ToolNode`, offline, with a
scripted fake model that emits tool calls."""

from __future__ import annotations

import asyncio

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

import tollgate
from tollgate.integrations.langchain import TollgateMiddleware


class ScriptedModel(FakeMessagesListChatModel):
    """Answers with the scripted messages in order; `create_agent` binds tools to it."""

    def bind_tools(self, tools, **kwargs):  # noqa: ARG002 - the script needs no schema
        return self


def calls(*args_list, tool_name="search"):
    """A script: one tool call per turn with each args dict, then a final answer."""
    msgs = [AIMessage(content="", tool_calls=[{"name": tool_name, "args": a, "id": f"call_{i}"}])
            for i, a in enumerate(args_list)]
    return msgs + [AIMessage(content="done")]


def make_agent(guard, script, ran, **mw):
    @tool
    def search(q: str) -> str:
        """Search the web."""
        ran.append(q)
        return f"results for {q}"

    return create_agent(ScriptedModel(responses=script), [search],
                        middleware=[TollgateMiddleware(guard, **mw)], checkpointer=InMemorySaver())


def tool_messages(result):
    return [m for m in result["messages"] if isinstance(m, ToolMessage)]


def run(agent, thread="t"):
    return agent.invoke({"messages": [("user", "go")]}, {"configurable": {"thread_id": thread}})


def test_an_allowed_call_runs_and_is_settled():
    guard = tollgate.Guard(budget_usd=1.0)
    ran = []
    result = run(make_agent(guard, calls({"q": "rust"}), ran, cost=0.25))
    assert ran == ["rust"]
    assert tool_messages(result)[0].content == "results for rust"
    assert guard.budget_remaining_usd == pytest.approx(0.75)


def test_a_repeated_call_is_denied_and_the_tool_never_runs():
    guard = tollgate.Guard(max_repeat_calls=3)
    ran = []
    result = run(make_agent(guard, calls(*[{"q": "same"}] * 4), ran))
    assert ran == ["same"] * 3
    last = tool_messages(result)[-1]
    assert last.status == "error"
    assert "max_repeat_exceeded" in last.content


def test_a_budget_overrun_is_denied():
    guard = tollgate.Guard(budget_usd=0.5)
    ran = []
    result = run(make_agent(guard, calls({"q": "a"}, {"q": "b"}), ran, cost=0.3))
    assert ran == ["a"]
    assert "budget_overrun" in tool_messages(result)[-1].content


def test_on_deny_raise_raises_tool_denied():
    guard = tollgate.Guard(budget_usd=0.1)
    with pytest.raises(tollgate.ToolDenied) as e:
        run(make_agent(guard, calls({"q": "a"}), [], cost=0.3, on_deny="raise"))
    assert e.value.reason == "budget_overrun"


def test_a_held_call_interrupts_the_graph_and_resumes_on_approve():
    guard = tollgate.Guard(hitl_mode="always")
    ran = []
    agent = make_agent(guard, calls({"q": "pay"}), ran)
    first = run(agent, "h1")
    assert ran == []
    (pending,) = first["__interrupt__"]
    assert pending.value["tollgate"] == "hitl" and pending.value["reason"] == "hitl_all_calls"
    assert pending.value["args"] == {"q": "pay"}
    done = agent.invoke(Command(resume="approve"), {"configurable": {"thread_id": "h1"}})
    assert ran == ["pay"]
    assert tool_messages(done)[-1].content == "results for pay"


def test_a_modified_call_runs_with_the_edited_arguments():
    guard = tollgate.Guard(hitl_mode="always")
    ran = []
    agent = make_agent(guard, calls({"q": "rm -rf"}), ran)
    run(agent, "h2")
    agent.invoke(Command(resume={"decision": "modify", "params": {"q": "ls"}, "operator": "alice"}),
                 {"configurable": {"thread_id": "h2"}})
    assert ran == ["ls"]


def test_a_rejected_call_never_runs():
    guard = tollgate.Guard(hitl_mode="always")
    ran = []
    agent = make_agent(guard, calls({"q": "x"}), ran)
    run(agent, "h3")
    done = agent.invoke(Command(resume="reject"), {"configurable": {"thread_id": "h3"}})
    assert ran == []
    assert "hitl_transition:reject" in tool_messages(done)[-1].content


def test_async_agents_are_guarded_too():
    guard = tollgate.Guard(max_repeat_calls=1)
    ran = []
    agent = make_agent(guard, calls({"q": "a"}, {"q": "a"}), ran)
    result = asyncio.run(agent.ainvoke({"messages": [("user", "go")]}, {"configurable": {"thread_id": "a"}}))
    assert ran == ["a"]
    assert "max_repeat_exceeded" in tool_messages(result)[-1].content


def test_a_bare_tool_node_takes_the_wrappers():
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    guard = tollgate.Guard(max_repeat_calls=1)
    ran = []

    @tool
    def search(q: str) -> str:
        """Search."""
        ran.append(q)
        return "ok"

    mw = TollgateMiddleware(guard)
    node = ToolNode([search], wrap_tool_call=mw.wrap_tool_call, awrap_tool_call=mw.awrap_tool_call)
    graph = StateGraph(MessagesState)
    graph.add_node("tools", node)
    graph.add_edge(START, "tools")
    app = graph.compile()
    msg = AIMessage(content="", tool_calls=[{"name": "search", "args": {"q": "z"}, "id": "1"}])
    app.invoke({"messages": [msg]})
    out = app.invoke({"messages": [msg]})
    assert ran == ["z"]
    assert "max_repeat_exceeded" in out["messages"][-1].content


def test_the_example_runs():
    from _examples import run_example

    out = run_example("langgraph_agent.py")
    assert out.count("results for tollgate") == 3
    assert "max_repeat_exceeded" in out and "paid INV-7" in out


def test_daemon_mode_denies_and_waits_for_an_operator(daemon):
    import threading

    client = tollgate.connect(socket=daemon.socket, secret_file=daemon.secret_file, agent_id="lc-bot", timeout=30)
    ran = []
    result = run(make_agent(client, calls(*[{"q": "same"}] * 4), ran), "d1")
    assert ran == ["same"] * 3
    assert "max_repeat_exceeded" in tool_messages(result)[-1].content

    held = tollgate.connect(socket=daemon.socket, secret_file=daemon.secret_file, agent_id="held-bot", timeout=30)
    op = tollgate.operator(socket=daemon.socket, secret_file=daemon.operator_secret_file)

    def approve_when_held():
        for _ in range(10_000):
            if any(p["session_id"] == held.session_id for p in op.pending()):
                op.decide(held.session_id, "approve", operator="alice")
                return

    t = threading.Thread(target=approve_when_held)
    t.start()
    ran2 = []
    result = run(make_agent(held, calls({"q": "pay"}), ran2, hitl_timeout=60), "d2")
    t.join()
    assert ran2 == ["pay"]
    assert tool_messages(result)[-1].content == "results for pay"


def test_daemon_mode_an_operators_modify_runs_only_the_edited_arguments(daemon):
    """Issue 16 §2: an operator modifies a held call; the tool body sees the edited
    arguments, never the original ones."""
    import threading

    from conftest import wait_until_held

    held = tollgate.connect(socket=daemon.socket, secret_file=daemon.secret_file, agent_id="held-bot", timeout=30)
    op = tollgate.operator(socket=daemon.socket, secret_file=daemon.operator_secret_file)

    def modify_when_held():
        wait_until_held(op, held.session_id)
        op.decide(held.session_id, "modify", operator="alice", params={"q": "edited"})

    t = threading.Thread(target=modify_when_held)
    t.start()
    ran = []
    result = run(make_agent(held, calls({"q": "original"}), ran, hitl_timeout=60), "m1")
    t.join()
    assert ran == ["edited"], ran
    assert tool_messages(result)[-1].content == "results for edited"


def make_payer(guard, script, paid, **mw):
    @tool
    def pay(i: int) -> str:
        """Pay invoice i."""
        paid.append(i)
        return f"paid {i}"

    return create_agent(ScriptedModel(responses=script), [pay],
                        middleware=[TollgateMiddleware(guard, **mw)], checkpointer=InMemorySaver())


@pytest.mark.parametrize("n", [2, 5, 8])
def test_several_held_calls_each_get_an_interrupt_and_are_resumed_in_any_order(n):
    """Issue 16 §1: one model response with n tool calls under HITL. Each call gets its own
    interrupt (and its own held call in Tollgate); they are resumed a few at a time, in a
    shuffled order, with approve / modify / reject; each decided call runs exactly once,
    with the decided arguments, or never, and a reject's note reaches the model."""
    import random

    guard = tollgate.Guard(hitl_mode="always")
    paid = []
    one_turn = AIMessage(content="", tool_calls=[{"name": "pay", "args": {"i": i}, "id": f"c{i}"} for i in range(n)])
    agent = make_payer(guard, [one_turn, AIMessage(content="done")], paid)
    cfg = {"configurable": {"thread_id": f"multi-{n}"}}
    out = agent.invoke({"messages": [("user", "pay them")]}, cfg)
    interrupts = out["__interrupt__"]
    assert sorted(i.value["tool_call_id"] for i in interrupts) == sorted(f"c{i}" for i in range(n))
    assert len({i.value["call_number"] for i in interrupts}) == n
    assert paid == []

    def decision(i):
        if i % 3 == 0:
            return "approve"
        if i % 3 == 1:
            return {"decision": "modify", "params": {"i": 100 + i}, "operator": "alice"}
        return {"decision": "reject", "note": f"not invoice {i}", "operator": "bob"}

    rng = random.Random(n)
    order = rng.sample(range(n), n)
    while order:
        k = rng.randint(1, 3)
        batch, order = order[:k], order[k:]
        ids = {i.value["tool_call_id"]: i.id for i in interrupts}
        out = agent.invoke(Command(resume={ids[f"c{i}"]: decision(i) for i in batch}), cfg)
        interrupts = out.get("__interrupt__", [])
        # The calls not resumed yet are still interrupted, nothing else.
        assert sorted(i.value["tool_call_id"] for i in interrupts) == sorted(f"c{i}" for i in order)
    assert "__interrupt__" not in out or not out["__interrupt__"]
    expected = sorted(i if i % 3 == 0 else 100 + i for i in range(n) if i % 3 != 2)
    assert sorted(paid) == expected, paid
    by_id = {m.tool_call_id: m for m in tool_messages(out)}
    for i in range(n):
        m = by_id[f"c{i}"]
        if i % 3 == 2:
            assert m.status == "error" and "hitl_transition:reject" in m.content and f"not invoice {i}" in m.content
        else:
            assert m.content == f"paid {i if i % 3 == 0 else 100 + i}"
    assert not guard.circuit_tripped


def test_daemon_mode_several_held_calls_each_wait_for_their_own_decision(daemon):
    """Issue 16 §1, daemon mode: a model response with four tool calls; the agent's
    client holds all four at once; an operator decides each by its call number, in a
    shuffled order; each decided call runs once with the decided arguments, or never."""
    import random
    import threading

    held = tollgate.connect(socket=daemon.socket, secret_file=daemon.secret_file, agent_id="held-bot", timeout=30)
    op = tollgate.operator(socket=daemon.socket, secret_file=daemon.operator_secret_file)
    paid = []
    n = 4
    one_turn = AIMessage(content="", tool_calls=[{"name": "pay", "args": {"i": i}, "id": f"c{i}"} for i in range(n)])
    agent = make_payer(held, [one_turn, AIMessage(content="done")], paid, hitl_timeout=120)
    plan = {0: ("approve", None, ""), 1: ("modify", {"i": 101}, ""), 2: ("reject", None, "wrong payee"),
            3: ("approve", None, "")}

    def decide_all():
        for _ in range(100_000):
            pending = [p for p in op.pending() if p["session_id"] == held.session_id and p["params"] is not None]
            if len(pending) == n:
                break
        for p in random.Random(3).sample(pending, len(pending)):
            d, params, note = plan[p["params"]["i"]]
            op.decide(held.session_id, d, operator="alice", params=params, note=note, call_number=p["call_number"])

    t = threading.Thread(target=decide_all)
    t.start()
    out = run(agent, "multi-daemon")
    t.join()
    assert sorted(paid) == [0, 3, 101], paid
    by_id = {m.tool_call_id: m for m in tool_messages(out)}
    assert "wrong payee" in by_id["c2"].content and by_id["c2"].status == "error"
    assert by_id["c1"].content == "paid 101"


def test_a_call_held_behind_others_is_refused_not_resolved():
    """Issue 16 §1: more calls in one response than the session may hold: the extra one is
    held behind (nothing recorded for it, no human can decide it). The adapter refuses it
    with a text saying why, instead of interrupting for it (resolving it used to raise and
    crash the run); the held ones are decided as usual."""
    guard = tollgate.Guard(hitl_mode="always", max_held_calls=2)
    paid = []
    one_turn = AIMessage(content="", tool_calls=[{"name": "pay", "args": {"i": i}, "id": f"c{i}"} for i in range(3)])
    agent = make_payer(guard, [one_turn, AIMessage(content="done")], paid)
    cfg = {"configurable": {"thread_id": "behind"}}
    out = agent.invoke({"messages": [("user", "pay them")]}, cfg)
    interrupts = out["__interrupt__"]
    assert len(interrupts) == 2
    done = agent.invoke(Command(resume={i.id: "approve" for i in interrupts}), cfg)
    assert len(paid) == 2
    refused = [m for m in tool_messages(done) if m.status == "error"]
    assert len(refused) == 1 and "held behind other calls" in refused[0].content
    assert "Call it again once the others are decided" in refused[0].content


# Issue 18: the calls the policy tests make, in order (conftest.py's `POLICY_TOOLS`,
# `POLICY_FLOWS`): allowed, refused by an argument rule, not on the allow-list, a read that
# labels the session, an e-mail out refused by the flow label, a payment held by an
# approval rule and approved by an operator.
POLICY_STEPS = [
    ("shell", {"command": "ls"}),
    ("shell", {"command": "rm -rf /"}),
    ("delete_repo", {"name": "prod"}),
    ("crm_lookup", {"customer": 7}),
    ("send_email", {"to": "partner@elsewhere.example", "body": "the customer's data"}),
    ("pay", {"amount": 250.5, "to": "shop"}),
]


def make_policy_agent(guard, ran, **mw):
    @tool
    def shell(command: str) -> str:
        """Run a shell command."""
        ran.append(("shell", command))
        return "ok"

    @tool
    def delete_repo(name: str) -> str:
        """Delete a repository."""
        ran.append(("delete_repo", name))
        return "deleted"

    @tool
    def crm_lookup(customer: int) -> str:
        """Look a customer up."""
        ran.append(("crm_lookup", customer))
        return "customer 7"

    @tool
    def send_email(to: str, body: str) -> str:
        """Send an e-mail."""
        ran.append(("send_email", to))
        return "sent"

    @tool
    def pay(amount: float, to: str) -> str:
        """Pay an amount."""
        ran.append(("pay", amount))
        return f"paid {amount}"

    script = [AIMessage(content="", tool_calls=[{"name": n, "args": a, "id": f"c{i}"}])
              for i, (n, a) in enumerate(POLICY_STEPS)] + [AIMessage(content="done")]
    return create_agent(ScriptedModel(responses=script), [shell, delete_repo, crm_lookup, send_email, pay],
                        middleware=[TollgateMiddleware(guard, **mw)], checkpointer=InMemorySaver())


def test_daemon_mode_policies_refuse_and_hold(policy_daemon):
    """Issue 18 over the middleware: each refused call is a `ToolMessage` error naming the
    policy, its body never runs; the held payment runs once an operator approves it."""
    import threading

    from conftest import wait_until_held

    client = tollgate.connect(socket=policy_daemon.socket, secret_file=policy_daemon.secret_file,
                              agent_id="lc-policy", timeout=30)
    op = tollgate.operator(socket=policy_daemon.socket, secret_file=policy_daemon.operator_secret_file)

    def approve():
        p = wait_until_held(op, client.session_id)
        assert p["tool"] == "pay" and p["held_reason"] == "policy_hold"
        op.decide(client.session_id, "approve", operator="alice", call_number=p["call_number"])

    t = threading.Thread(target=approve)
    t.start()
    ran = []
    result = run(make_policy_agent(client, ran, hitl_timeout=60), "policy")
    t.join()
    assert ran == [("shell", "ls"), ("crm_lookup", 7), ("pay", 250.5)], ran
    by_id = {m.tool_call_id: m for m in tool_messages(result)}
    for call, reason in [("c1", "policy:shell-commands"), ("c2", "policy_default_deny"),
                         ("c4", "policy:mail-out-after-customer-data")]:
        assert by_id[call].status == "error" and reason in by_id[call].content, by_id[call]
    assert by_id["c5"].content == "paid 250.5"
    assert not client.session_state()["circuit_tripped"]


def test_library_mode_policies_refuse_and_interrupt(tmp_path):
    """Issue 18 with `Guard(policy=...)`: the refused calls' bodies never run, the model
    reads the policy's reason; the `@hitl` payment interrupts the graph with the policy's
    text and runs once resumed with an approval."""
    import textwrap

    from conftest import POLICY_FLOWS, POLICY_TOOLS

    (tmp_path / "tools.cedar").write_text(textwrap.dedent(POLICY_TOOLS))
    (tmp_path / "flows.cedar").write_text(textwrap.dedent(POLICY_FLOWS))
    guard = tollgate.Guard(policy={"files": [str(tmp_path / "tools.cedar"), str(tmp_path / "flows.cedar")],
                                   "default": "deny"})
    ran = []
    agent = make_policy_agent(guard, ran)
    first = run(agent, "lib-policy")
    (pending,) = first["__interrupt__"]
    assert pending.value["reason"] == "policy:big-payments"
    assert "payment over 100 USD" in pending.value["explanation"]
    assert ran == [("shell", "ls"), ("crm_lookup", 7)], ran
    done = agent.invoke(Command(resume="approve"), {"configurable": {"thread_id": "lib-policy"}})
    assert ran == [("shell", "ls"), ("crm_lookup", 7), ("pay", 250.5)], ran
    by_id = {m.tool_call_id: m for m in tool_messages(done)}
    for call, reason in [("c1", "policy:shell-commands"), ("c2", "policy_default_deny"),
                         ("c4", "policy:mail-out-after-customer-data")]:
        assert by_id[call].status == "error" and reason in by_id[call].content, by_id[call]
    assert by_id["c5"].content == "paid 250.5"
