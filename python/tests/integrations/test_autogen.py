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
