"""A CrewAI crew guarded by Tollgate's tool hooks (library mode), offline: a scripted
ReAct LLM asks to delete a file; Tollgate holds it for a human, who narrows the path.
Requires `crewai`.

    CREWAI_DISABLE_TELEMETRY=true OTEL_SDK_DISABLED=true python examples/python/crewai_example.py
"""

import json
import os

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

from crewai import Agent, Crew, Task  # noqa: E402
from crewai.llms.base_llm import BaseLLM  # noqa: E402
from crewai.tools import tool  # noqa: E402

import tollgate  # noqa: E402
from tollgate.integrations.crewai import TollgateHooks  # noqa: E402


class ScriptedLLM(BaseLLM):
    """One ReAct action, then the final answer (a stand-in for a real model)."""

    steps: list = []

    def call(self, messages, tools=None, callbacks=None, available_functions=None, from_task=None,
             from_agent=None, response_model=None):
        if self.steps:
            return f"Thought: clean up\nAction: delete\nAction Input: {json.dumps(self.steps.pop(0))}"
        return "Thought: I now know the final answer\nFinal Answer: cleaned up"

    def supports_function_calling(self):
        return False


@tool("delete")
def delete(path: str) -> str:
    """Delete a path."""
    print(f"delete ran with path={path}")  # a real tool would delete it
    return f"deleted {path}"


def human(verdict):
    print(f"held for a human: {verdict.tool} {verdict.params} ({verdict.reason})")
    return tollgate.Decision("modify", operator="alice", params={"path": "/tmp/build"})


guard = tollgate.Guard(hitl_mode="always", on_hitl=human)
hooks = TollgateHooks(guard).register()
llm = ScriptedLLM(model="scripted", steps=[{"path": "/"}])
agent = Agent(role="janitor", goal="free disk space", backstory="", llm=llm, tools=[delete], verbose=False)
task = Task(description="free disk space", expected_output="what was deleted", agent=agent)
print(Crew(agents=[agent], tasks=[task], verbose=False).kickoff())
hooks.unregister()
