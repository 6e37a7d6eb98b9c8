"""AutoGen: the real `AssistantAgent`, offline, with `ReplayChatCompletionClient`
scripted to emit tool calls."""

from __future__ import annotations

import asyncio
import json

from autogen_agentchat.agents import AssistantAgent
from autogen_core import FunctionCall
from autogen_core.models import CreateResult, RequestUsage
from autogen_core.tools import FunctionTool
from autogen_ext.models.replay import ReplayChatCompletionClient

import tollgate
from tollgate.integrations.autogen import guard_tools


def tool_call(args, i=0):
    return CreateResult(finish_reason="function_calls",
                        content=[FunctionCall(id=f"call_{i}", name="search", arguments=json.dumps(args))],
                        usage=RequestUsage(prompt_tokens=0, completion_tokens=0), cached=False)


def make(guard, script, ran, cost=0.0):
    def search(q: str) -> str:
        ran.append(q)
        return f"results for {q}"

    client = ReplayChatCompletionClient(script, model_info={"vision": False, "function_calling": True,
                                                            "json_output": False, "family": "unknown",
                                                            "structured_output": False})
    tools = guard_tools(guard, [FunctionTool(search, description="Search the web")], cost=cost)
    return AssistantAgent("bot", model_client=client, tools=tools)


def results(task_result):
    out = []
    for m in task_result.messages:
        if m.type == "ToolCallExecutionEvent":
            out.extend(r.content for r in m.content)
    return out


def run_turns(agent, n):
    async def go():
        return [await agent.run(task="go") for _ in range(n)]

    return asyncio.run(go())


def test_an_allowed_call_runs_and_is_settled():
    guard = tollgate.Guard(budget_usd=1.0)
    ran = []
    (r,) = run_turns(make(guard, [tool_call({"q": "rust"})], ran, cost=0.25), 1)
    assert ran == ["rust"]
    assert results(r) == ["results for rust"]
    assert guard.budget_remaining_usd == 0.75


def test_a_repeated_call_is_denied_and_the_tool_never_runs():
    guard = tollgate.Guard(max_repeat_calls=3)
    ran = []
    turns = run_turns(make(guard, [tool_call({"q": "same"}, i) for i in range(4)], ran), 4)
    assert ran == ["same"] * 3
    assert "max_repeat_exceeded" in results(turns[-1])[0]


def test_a_budget_overrun_is_denied():
    guard = tollgate.Guard(budget_usd=0.5)
    ran = []
    turns = run_turns(make(guard, [tool_call({"q": "a"}, 0), tool_call({"q": "b"}, 1)], ran, cost=0.3), 2)
    assert ran == ["a"]
    assert "budget_overrun" in results(turns[-1])[0]


def test_a_held_call_runs_after_a_human_modifies_it():
    asked = []

    def human(verdict):
        asked.append((verdict.tool, verdict.params))
        return tollgate.Decision("modify", operator="alice", params={"q": "safe"})

    guard = tollgate.Guard(hitl_mode="always", on_hitl=human)
    ran = []
    (r,) = run_turns(make(guard, [tool_call({"q": "risky"})], ran), 1)
    assert asked == [("search", {"q": "risky"})]
    assert ran == ["safe"]
    assert results(r) == ["results for safe"]


def test_a_held_call_without_a_human_is_not_run():
    guard = tollgate.Guard(hitl_mode="always")
    ran = []
    (r,) = run_turns(make(guard, [tool_call({"q": "x"})], ran), 1)
    assert ran == []
    assert "held for a human: hitl_all_calls" in results(r)[0]


def test_the_example_runs():
    from _examples import run_example

    out = run_example("autogen_example.py")
    assert "image of a cat" in out and "budget_overrun" in out


def test_a_reject_note_reaches_the_model():
    guard = tollgate.Guard(hitl_mode="always",
                           on_hitl=lambda v: tollgate.Decision("reject", operator="bob", note="use the sandbox"))
    ran = []
    (r,) = run_turns(make(guard, [tool_call({"q": "prod"})], ran), 1)
    assert ran == []
    assert "hitl_transition:reject" in results(r)[0] and "use the sandbox" in results(r)[0]


def parallel_calls(args_list):
    return CreateResult(finish_reason="function_calls",
                        content=[FunctionCall(id=f"call_{i}", name="search", arguments=json.dumps(a))
                                 for i, a in enumerate(args_list)],
                        usage=RequestUsage(prompt_tokens=0, completion_tokens=0), cached=False)


def test_several_held_calls_in_one_response_are_each_decided(daemon):
    """Issue 16 §1, §2, §5, daemon mode: one model response with three tool calls, which
    AutoGen runs concurrently; each is held and decided by an operator by its call number;
    the modified one runs with the edited arguments only, the rejected one never, with the
    operator's note."""
    import random
    import threading

    client = tollgate.connect(socket=daemon.socket, secret_file=daemon.secret_file, agent_id="held-bot",
                              timeout=30)
    op = tollgate.operator(socket=daemon.socket, secret_file=daemon.operator_secret_file)
    ran = []
    agent = make(client, [parallel_calls([{"q": "a"}, {"q": "b"}, {"q": "c"}])], ran)
    plan = {"a": ("approve", None, ""), "b": ("modify", {"q": "b-edited"}, ""), "c": ("reject", None, "not c")}

    def decide_all():
        for _ in range(100_000):
            pending = [p for p in op.pending() if p["session_id"] == client.session_id and p["params"] is not None]
            if len(pending) == 3:
                break
        for p in random.Random(2).sample(pending, len(pending)):
            d, params, note = plan[p["params"]["q"]]
            op.decide(client.session_id, d, operator="alice", params=params, note=note,
                      call_number=p["call_number"])

    t = threading.Thread(target=decide_all)
    t.start()
    (r,) = run_turns(agent, 1)
    t.join()
    assert sorted(ran) == ["a", "b-edited"], ran
    out = results(r)
    assert "results for b-edited" in out and "results for a" in out
    assert any("not c" in o and "hitl_transition:reject" in o for o in out), out


def test_daemon_mode_policies_refuse_and_hold(policy_daemon):
    """Issue 18 through `guard_tools`, one call per turn: each refused call's error names
    the policy and its body never runs; the held payment runs once an operator approves."""
    import threading

    from conftest import wait_until_held

    client = tollgate.connect(socket=policy_daemon.socket, secret_file=policy_daemon.secret_file,
                              agent_id="ag-policy", timeout=30)
    op = tollgate.operator(socket=policy_daemon.socket, secret_file=policy_daemon.operator_secret_file)
    ran = []

    def shell(command: str) -> str:
        ran.append(("shell", command))
        return "ok"

    def delete_repo(name: str) -> str:
        ran.append(("delete_repo", name))
        return "deleted"

    def crm_lookup(customer: int) -> str:
        ran.append(("crm_lookup", customer))
        return "customer 7"

    def send_email(to: str, body: str) -> str:
        ran.append(("send_email", to))
        return "sent"

    def pay(amount: float, to: str) -> str:
        ran.append(("pay", amount))
        return f"paid {amount}"

    steps = [("shell", {"command": "ls"}), ("shell", {"command": "rm -rf /"}), ("delete_repo", {"name": "prod"}),
             ("crm_lookup", {"customer": 7}),
             ("send_email", {"to": "partner@elsewhere.example", "body": "the customer's data"}),
             ("pay", {"amount": 250.5, "to": "shop"})]
    script = [CreateResult(finish_reason="function_calls",
                           content=[FunctionCall(id=f"call_{i}", name=n, arguments=json.dumps(a))],
                           usage=RequestUsage(prompt_tokens=0, completion_tokens=0), cached=False)
              for i, (n, a) in enumerate(steps)]
    model = ReplayChatCompletionClient(script, model_info={"vision": False, "function_calling": True,
                                                           "json_output": False, "family": "unknown",
                                                           "structured_output": False})
    fns = [shell, delete_repo, crm_lookup, send_email, pay]
    agent = AssistantAgent("bot", model_client=model,
                           tools=guard_tools(client, [FunctionTool(f, description=f.__name__) for f in fns],
                                             hitl_timeout=60))

    def approve():
        p = wait_until_held(op, client.session_id)
        assert p["tool"] == "pay" and p["held_reason"] == "policy_hold"
        op.decide(client.session_id, "approve", operator="alice", call_number=p["call_number"])

    t = threading.Thread(target=approve)
    t.start()
    turns = run_turns(agent, len(steps))
    t.join()
    assert ran == [("shell", "ls"), ("crm_lookup", 7), ("pay", 250.5)], ran
    outs = [results(r)[0] for r in turns]
    for i, reason in [(1, "policy:shell-commands"), (2, "policy_default_deny"),
                      (4, "policy:mail-out-after-customer-data")]:
        assert reason in outs[i], outs
    assert outs[5] == "paid 250.5", outs
    assert not client.session_state()["circuit_tripped"]
