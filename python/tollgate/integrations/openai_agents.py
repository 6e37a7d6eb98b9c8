"""OpenAI Agents SDK: a tool input guardrail that rejects with Tollgate's reason, a tool
output guardrail that settles the call, and `needs_approval` wired to Tollgate's HITL.

```python
from agents import Agent, function_tool
from tollgate.integrations.openai_agents import TollgateGuardrails

tg = TollgateGuardrails(guard, cost=0.01)

@function_tool
def search(q: str) -> str: ...

agent = Agent(name="bot", tools=[tg.protect(search)])
```

- `needs_approval` asks Tollgate first (library mode): an ALLOW or a DENY needs no
  approval; a HITL interrupts the run (`result.interruptions`). Approve it with
  `state.approve(item)` (or `tg.approve(state, item, operator=...)`, which also names the
  operator in the audit log); reject it with `tg.reject(state, item, operator=...)`, which
  records the rejection in Tollgate too (a bare `state.reject` leaves the held call
  pending in Tollgate, and the guard's next call is held behind it). The SDK's approvals
  cannot edit arguments, so `modify` is not offered here.
- The input guardrail runs when the tool is about to execute: ALLOW runs it; DENY
  rejects the call and the model reads `Tollgate blocked the call to `x`: reason`; a
  call approved in the SDK is released in Tollgate (re-dispatched with its nonce) first.
  In daemon mode (`Client`) the guardrail itself waits for the daemon's operator on HITL,
  and `needs_approval` is never true. An operator's `modify` cannot be run by a guardrail
  (it cannot change the arguments the SDK passes), so such a call is refused, never run
  with the original arguments, and the model is told the changed arguments.
- The output guardrail settles the call's cost (the estimate) after it ran.
"""

from __future__ import annotations

import threading
from typing import Any, Awaitable, Callable, Dict, Optional, Union

from agents import (
    FunctionTool,
    RunState,
    ToolApprovalItem,
    ToolGuardrailFunctionOutput,
    ToolInputGuardrailData,
    ToolOutputGuardrailData,
    tool_input_guardrail,
    tool_output_guardrail,
)

from .._guarded import Client, Guard
from . import _common

__all__ = ["TollgateGuardrails"]


def _call_id_of(item: ToolApprovalItem) -> str:
    raw = item.raw_item
    return str(raw.get("call_id", "") if isinstance(raw, dict) else getattr(raw, "call_id", ""))


class TollgateGuardrails:
    """Guardrails and an approval policy for `function_tool`, backed by `guard` (a
    `tollgate.Guard` or a `tollgate.Client`). `cost`: a call's estimated cost (a number or
    a function of `(tool_name, args)`)."""

    def __init__(self, guard: Union[Guard, Client], *, cost: _common.Cost = 0.0, hitl_timeout: float = 900.0) -> None:
        self.guard = guard
        self.cost = cost
        self.hitl_timeout = hitl_timeout
        self._verdicts: Dict[str, Any] = {}  # by call id: the verdict to act on
        self._operators: Dict[str, str] = {}  # by call id: who approved in the SDK
        self._lock = threading.Lock()
        self.input_guardrail = tool_input_guardrail(self._before, name="tollgate")
        self.output_guardrail = tool_output_guardrail(self._after, name="tollgate_settle")

    def protect(self, tool: FunctionTool) -> FunctionTool:
        """Add both guardrails to a `FunctionTool` and, in library mode, set its
        `needs_approval` to Tollgate's HITL. Returns the same tool."""
        tool.tool_input_guardrails = [*(tool.tool_input_guardrails or []), self.input_guardrail]
        tool.tool_output_guardrails = [*(tool.tool_output_guardrails or []), self.output_guardrail]
        if isinstance(self.guard, Guard):
            tool.needs_approval = self.needs_approval_for(tool.name)
        return tool

    def needs_approval_for(self, tool: str) -> Callable[[Any, Dict[str, Any], str], Awaitable[bool]]:
        """The SDK's approval policy for `tool` (the SDK does not pass the tool's name):
        ask Tollgate now; only a HITL needs a human."""

        async def needs_approval(run_context: Any, params: Dict[str, Any], call_id: str) -> bool:  # noqa: ARG001
            with self._lock:
                known = self._verdicts.get(call_id)
            if known is not None:
                return bool(known.verdict == "HITL" and not _common.held_behind(self.guard, known))
            return await self._first_check(call_id, tool, params)

        return needs_approval

    async def _first_check(self, call_id: str, tool: str, params: Any) -> bool:
        v = await self.guard.acheck(tool, params, _common.estimate(self.cost, tool, params))
        with self._lock:
            self._verdicts[call_id] = v
        # A call held behind others has no held call of its own to approve: it needs no
        # approval, and the input guardrail refuses it.
        return bool(v.verdict == "HITL" and not _common.held_behind(self.guard, v))

    def approve(self, state: RunState, item: ToolApprovalItem, *, operator: str = "openai-agents") -> None:
        """Approve a held call in the SDK and name its `operator` for Tollgate's log."""
        with self._lock:
            self._operators[_call_id_of(item)] = operator
        state.approve(item)

    def reject(self, state: RunState, item: ToolApprovalItem, *, operator: str = "openai-agents",
               message: Optional[str] = None) -> None:
        """Reject a held call in the SDK and record the rejection in Tollgate, with
        `message` (the human's reasons) as the decision's note; the model reads the
        message with the refusal."""
        call_id = _call_id_of(item)
        with self._lock:
            held = self._verdicts.pop(call_id, None)
        if held is not None and held.verdict == "HITL" and isinstance(self.guard, Guard):
            self.guard.resolve(held, "reject", operator=operator, note=(message or "")[:1024])
        text = f"Tollgate: `{item.tool_name}` was rejected by {operator}"
        if message:
            text += f": {message}"
        state.reject(item, rejection_message=text)

    async def _before(self, data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        ctx = data.context
        call_id = ctx.tool_call_id
        tool = ctx.tool_name
        args = _common.args_dict(ctx.tool_arguments)
        note = ""
        with self._lock:
            v = self._verdicts.get(call_id)
            operator = self._operators.pop(call_id, "openai-agents")
        cost = _common.estimate(self.cost, tool, args if isinstance(args, dict) else {})
        if v is None:  # needs_approval was not wired (or daemon mode): decide now
            if isinstance(self.guard, Client):
                out = await _common.acheck_or_wait(self.guard, tool, args, cost, hitl_timeout=self.hitl_timeout)
                v = out.verdict
                if out.modified or (v.allowed and v.reason == "hitl_transition:modify_successor"):
                    # An operator changed the arguments, and a guardrail cannot change what
                    # the SDK runs: refuse, never run the original ones, and tell the model.
                    await self.guard.asettle(v, 0.0, error="not run: the framework cannot run edited arguments")
                    return ToolGuardrailFunctionOutput.reject_content(
                        _common.modified_text(tool, out.params, out.note),
                        output_info={"tollgate": "hitl_transition:modify_not_runnable"})
                note = out.note
            else:
                v = await self.guard.acheck(tool, args, cost)
                note = ""
        elif v.verdict == "HITL" and isinstance(self.guard, Guard) and not _common.held_behind(self.guard, v):
            # The tool only executes after the SDK's approval: release it in Tollgate.
            v = self.guard.resolve(v, "approve", operator=operator).verdict
        with self._lock:
            self._verdicts[call_id] = v
        if v.allowed:
            return ToolGuardrailFunctionOutput.allow(output_info={"tollgate": v.reason})
        with self._lock:
            self._verdicts.pop(call_id, None)
        text = _common.held_behind_text(v) if _common.held_behind(self.guard, v) else _common.deny_text(v, note)
        return ToolGuardrailFunctionOutput.reject_content(text, output_info={"tollgate": v.reason})

    async def _after(self, data: ToolOutputGuardrailData) -> ToolGuardrailFunctionOutput:
        with self._lock:
            v = self._verdicts.pop(data.context.tool_call_id, None)
        if v is not None and v.allowed:
            await self.guard.asettle(v, None)
        return ToolGuardrailFunctionOutput.allow()
