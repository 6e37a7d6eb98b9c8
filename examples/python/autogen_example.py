"""An AutoGen `AssistantAgent` whose tools are guarded by Tollgate (library mode),
offline: `ReplayChatCompletionClient` replays two tool calls whose estimated costs
overrun the budget. Requires `autogen-agentchat` and `autogen-ext`.

    python examples/python/autogen_example.py
"""

import asyncio
import json

from autogen_agentchat.agents import AssistantAgent
from autogen_core import FunctionCall
from autogen_core.models import CreateResult, RequestUsage
from autogen_core.tools import FunctionTool
from autogen_ext.models.replay import ReplayChatCompletionClient

import tollgate
from tollgate.integrations.autogen import guard_tools


def generate_image(prompt: str) -> str:
    return f"image of {prompt}"


def tool_call(prompt):
    return CreateResult(finish_reason="function_calls", cached=False,
                        usage=RequestUsage(prompt_tokens=0, completion_tokens=0),
                        content=[FunctionCall(id="1", name="generate_image", arguments=json.dumps({"prompt": prompt}))])


async def main():
    guard = tollgate.Guard(budget_usd=0.10)
    client = ReplayChatCompletionClient(
        [tool_call("a cat"), tool_call("a dog")],
        model_info={"vision": False, "function_calling": True, "json_output": False, "family": "unknown",
                    "structured_output": False})
    tools = guard_tools(guard, [FunctionTool(generate_image, description="Generate an image")], cost=0.08)
    agent = AssistantAgent("artist", model_client=client, tools=tools)
    for _ in range(2):
        result = await agent.run(task="draw")
        print(f"generate_image: {result.messages[-1].content}")
    print(f"budget left: ${guard.budget_remaining_usd:.2f}")


asyncio.run(main())
