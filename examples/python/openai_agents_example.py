"""An OpenAI Agents SDK agent guarded by Tollgate (library mode), offline.

The model is a scripted `Model` that calls `search` twice with the same query (the second
is over `max_repeat_calls=1`), then answers. Requires `openai-agents`.

    python examples/python/openai_agents_example.py
"""

import json

from agents import Agent, ModelResponse, Runner, Usage, function_tool, set_tracing_disabled
from agents.models.interface import Model
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

import tollgate
from tollgate.integrations.openai_agents import TollgateGuardrails

set_tracing_disabled(True)


class ScriptedModel(Model):
    """Each turn: the next scripted function call, then a final answer."""

    def __init__(self, calls):
        self.calls = list(calls)

    async def get_response(self, *args, **kwargs):
        if self.calls:
            i, (name, a) = len(self.calls), self.calls.pop(0)
            out = ResponseFunctionToolCall(id=f"c{i}", call_id=f"c{i}", type="function_call", name=name,
                                           arguments=json.dumps(a))
        else:
            out = ResponseOutputMessage(id="m", type="message", role="assistant", status="completed",
                                        content=[ResponseOutputText(type="output_text", text="done", annotations=[])])
        return ModelResponse(output=[out], usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError


@function_tool
def search(q: str) -> str:
    """Search the web."""
    return f"results for {q}"


guard = tollgate.Guard(budget_usd=1.0, max_repeat_calls=1)
tg = TollgateGuardrails(guard, cost=0.01)
agent = Agent(name="researcher", model=ScriptedModel([("search", {"q": "sp/1.0"})] * 2), tools=[tg.protect(search)])
result = Runner.run_sync(agent, "research SP/1.0")
for item in result.new_items:
    if item.type == "tool_call_output_item":
        print(f"search: {item.output}")
print(f"final: {result.final_output}; budget left: ${guard.budget_remaining_usd:.2f}")
