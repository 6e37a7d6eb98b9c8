"""AutoGen (`autogen-agentchat` / `autogen-core`): a wrapper for tools.

```python
from autogen_agentchat.agents import AssistantAgent
from autogen_core.tools import FunctionTool
from tollgate.integrations.autogen import guard_tools

tools = guard_tools(guard, [FunctionTool(search, description="Search the web")], cost=0.01)
agent = AssistantAgent("bot", model_client=client, tools=tools)
```

Each wrapped tool keeps the inner tool's name, description and argument schema. Before it
runs, the call is checked: ALLOW runs it and settles its cost (the estimate) after it;
DENY raises `ToolDenied`, which AutoGen hands to the model as the tool's error result
(`tool `search` denied: max_repeat_exceeded`), so the tool body never runs. HITL waits for
a human: a library-mode `Guard` asks its `on_hitl` handler (no handler: `HeldForHuman`
is raised, and the model reads that); a daemon-mode `Client` waits for the daemon's
operator. A human's `modify` runs the tool with the edited arguments (never the original
ones); a human's refusal is the tool's error result, with the human's note
(`tool `pay` denied: hitl_transition:reject (the human's note: over the limit)`).
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence, Union

from autogen_core import CancellationToken
from autogen_core.tools import BaseTool
from pydantic import BaseModel

from .._errors import HeldForHuman, ToolDenied
from .._guarded import Client, Guard
from . import _common

__all__ = ["GuardedTool", "guard_tools"]


class GuardedTool(BaseTool[BaseModel, Any]):
    """`inner`, asked of `guard` before every call (see the module's doc)."""

    def __init__(self, inner: BaseTool[Any, Any], guard: Union[Guard, Client], *, cost: _common.Cost = 0.0,
                 hitl_timeout: float = 900.0) -> None:
        super().__init__(inner.args_type(), inner.return_type(), inner.name, inner.description,
                         strict=bool(inner.schema.get("strict", False)))
        self.inner = inner
        self.guard = guard
        self.cost = cost
        self.hitl_timeout = hitl_timeout

    async def run(self, args: BaseModel, cancellation_token: CancellationToken) -> Any:
        """Run through `run_json` so that the check sees the arguments."""
        return await self.run_json(args.model_dump(), cancellation_token)

    async def run_json(self, args: Mapping[str, Any], cancellation_token: CancellationToken,
                       call_id: Optional[str] = None) -> Any:
        params = dict(args)
        cost = _common.estimate(self.cost, self.name, params)
        out = await _common.acheck_or_wait(self.guard, self.name, params, cost, hitl_timeout=self.hitl_timeout)
        verdict, run_params = out.verdict, out.params
        if not verdict.allowed:
            if verdict.verdict == "HITL":
                raise HeldForHuman(verdict, out.note)
            raise ToolDenied(verdict, out.note)
        try:
            result = await self.inner.run_json(run_params, cancellation_token, call_id=call_id)
        except Exception as e:
            await self.guard.asettle(verdict, None, error=f"{type(e).__name__}: {e}")
            raise
        await self.guard.asettle(verdict, None)
        return result

    def return_value_as_string(self, value: Any) -> str:
        return self.inner.return_value_as_string(value)


def guard_tools(guard: Union[Guard, Client], tools: Sequence[BaseTool[Any, Any]], *, cost: _common.Cost = 0.0,
                hitl_timeout: float = 900.0) -> List[GuardedTool]:
    """Wrap each of `tools` in a `GuardedTool`."""
    return [GuardedTool(t, guard, cost=cost, hitl_timeout=hitl_timeout) for t in tools]
