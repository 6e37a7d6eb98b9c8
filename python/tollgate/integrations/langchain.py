"""LangChain v1 / LangGraph: every tool call goes through Tollgate.

```python
from langchain.agents import create_agent
from tollgate.integrations.langchain import TollgateMiddleware

guard = tollgate.Guard(budget_usd=1.0, max_repeat_calls=3)
agent = create_agent(model, tools, middleware=[TollgateMiddleware(guard, cost=0.01)])
```

For a bare LangGraph `ToolNode`: `ToolNode(tools, wrap_tool_call=mw.wrap_tool_call,
awrap_tool_call=mw.awrap_tool_call)`.

- ALLOW: the tool runs, and its cost (the estimate) is settled after it.
- DENY: the tool does not run; the model gets a `ToolMessage` with `status="error"` that
  says why (`Tollgate blocked the call to `search`: max_repeat_exceeded`), or, with
  `on_deny="raise"`, `ToolDenied` is raised.
- HITL, library mode (`Guard`): the graph is paused with LangGraph's `interrupt()`; the
  interrupt's value is a dict `{"tollgate": "hitl", "tool", "args", "reason",
  "explanation", "call_number", "tool_call_id"}` (`explanation`: why it was held, in words,
  e.g. a `@hitl` policy's text; `""` when the guards held it). Resume it with `Command(resume=...)` where the value is
  a decision word (`"approve"`, `"reject"`) or a dict `{"decision": "approve" | "reject"
  | "modify", "params": {...edited args...}, "operator": "alice", "note": "why"}`. An
  approved call runs as held; a modified one runs with the edited arguments (never the
  original ones); a rejected one never runs, and the model's `ToolMessage` carries the
  note. (A checkpointer is required, as for any interrupt.) Held calls are remembered by
  tool-call id in this middleware, so the resume must reach the same process.
- Several tool calls in one model response, all held: each gets its own interrupt
  (`result["__interrupt__"]` lists them all) and its own held call in Tollgate. Resume
  them together, `Command(resume={i.id: "approve", j.id: {"decision": "reject", ...}})`,
  or some now and the rest later, in any order: a call not named in a resume stays
  interrupted (with the same interrupt id), and each call runs at most once, after its own
  decision.
- HITL, daemon mode (`Client`): the call waits for an operator's decision on the daemon
  (`tollgate hitl decide`, or `tollgate.operator(...)`), up to `hitl_timeout` seconds;
  an operator's modify runs the edited arguments, a reject's note reaches the model.
"""

from __future__ import annotations

import threading
from typing import Any, Awaitable, Callable, Dict, Mapping, Union, cast

from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage
from langgraph.types import interrupt

from .._errors import ToolDenied
from .._guarded import Client, Guard
from . import _common

__all__ = ["TollgateMiddleware"]


class TollgateMiddleware(AgentMiddleware):
    """An agent middleware (`wrap_tool_call` / `awrap_tool_call`) that asks `guard` (a
    `tollgate.Guard` or a `tollgate.Client`) before every tool call.

    `cost`: the estimated cost in dollars of one call (a number, or a function of
    `(tool_name, args)`). `on_deny`: `"message"` (the model reads why) or `"raise"`.
    `hitl_timeout`: how long a daemon-mode call waits for an operator.
    """

    def __init__(self, guard: Union[Guard, Client], *, cost: _common.Cost = 0.0,
                 on_deny: str = "message", hitl_timeout: float = 900.0) -> None:
        super().__init__()
        if on_deny not in ("message", "raise"):
            raise ValueError("on_deny is 'message' or 'raise'")
        self.guard = guard
        self.cost = cost
        self.on_deny = on_deny
        self.hitl_timeout = hitl_timeout
        # Library mode: held verdicts by tool-call id, so that the node's re-execution on
        # resume does not dispatch the call a second time.
        self._held: Dict[str, Any] = {}
        self._lock = threading.Lock()

    # -- the decision, shared by the sync and async paths ------------------------------

    def _denied(self, request: Any, out: _common.Outcome) -> ToolMessage:
        if self.on_deny == "raise":
            raise ToolDenied(out.verdict, out.note)
        call = request.tool_call
        text = (_common.held_behind_text(out.verdict) if _common.held_behind(self.guard, out.verdict)
                else _common.deny_text(out.verdict, out.note))
        return ToolMessage(content=text, tool_call_id=call.get("id") or "", name=call.get("name"), status="error")

    def _interrupt_for_human(self, request: Any, held: Any) -> _common.Outcome:
        """Library mode: pause the graph, and once resumed, record the decision (on this
        held call, by its own call number: several may be held at once) and return the
        outcome for the call."""
        guard = cast(Guard, self.guard)
        call = request.tool_call
        call_id = call.get("id") or ""
        with self._lock:
            self._held[call_id] = held
        answer = interrupt({
            "tollgate": "hitl",
            "tool": held.tool,
            "args": held.params,
            "reason": held.reason,
            "explanation": held.explanation,
            "call_number": held.call_number,
            "tool_call_id": call_id,
        })
        with self._lock:
            self._held.pop(call_id, None)
        if isinstance(answer, str):
            answer = {"decision": answer}
        if not isinstance(answer, Mapping) or "decision" not in answer:
            raise ValueError("resume a Tollgate interrupt with a decision word or "
                             "{'decision': ..., 'params': ..., 'operator': ..., 'note': ...}")
        r = guard.resolve(held, str(answer["decision"]), operator=str(answer.get("operator", "langgraph")),
                          params=answer.get("params"), note=str(answer.get("note") or ""))
        return _common.Outcome(r.verdict, r.params, r.decision, r.note)

    def _decide(self, request: Any) -> Any:
        call = request.tool_call
        name = call.get("name", "")
        args = _common.args_dict(call.get("args", {}))
        if isinstance(self.guard, Guard):
            held = self._held.get(call.get("id") or "")
            if held is not None:  # the node re-runs on resume: this call was already held
                return self._interrupt_for_human(request, held)
            v = self.guard.check(name, args, _common.estimate(self.cost, name, args))
            if v.verdict == "HITL" and not _common.held_behind(self.guard, v):
                return self._interrupt_for_human(request, v)
            return _common.Outcome(v, args)
        return _common.check_or_wait(self.guard, name, args, _common.estimate(self.cost, name, args),
                                     hitl_timeout=self.hitl_timeout)

    async def _adecide(self, request: Any) -> Any:
        call = request.tool_call
        name = call.get("name", "")
        args = _common.args_dict(call.get("args", {}))
        if isinstance(self.guard, Guard):
            held = self._held.get(call.get("id") or "")
            if held is not None:
                return self._interrupt_for_human(request, held)
            v = await self.guard.acheck(name, args, _common.estimate(self.cost, name, args))
            if v.verdict == "HITL" and not _common.held_behind(self.guard, v):
                return self._interrupt_for_human(request, v)
            return _common.Outcome(v, args)
        return await _common.acheck_or_wait(self.guard, name, args, _common.estimate(self.cost, name, args),
                                            hitl_timeout=self.hitl_timeout)

    @staticmethod
    def _with_args(request: Any, params: Any) -> Any:
        if params is None or params == request.tool_call.get("args"):
            return request
        return request.override(tool_call={**request.tool_call, "args": dict(params)})

    # -- the middleware hooks ----------------------------------------------------------

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Check the call; run it only on ALLOW; settle it after."""
        out = self._decide(request)
        verdict, params = out.verdict, out.params
        if not verdict.allowed:
            return self._denied(request, out)
        try:
            result = handler(self._with_args(request, params))
        except Exception as e:
            _common.settle_quietly(self.guard, verdict, error=f"{type(e).__name__}: {e}")
            raise
        _common.settle_quietly(self.guard, verdict, error=_tool_error(result))
        return result

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        """`wrap_tool_call` for async agents (`ainvoke`, `astream`)."""
        out = await self._adecide(request)
        verdict, params = out.verdict, out.params
        if not verdict.allowed:
            return self._denied(request, out)
        try:
            result = await handler(self._with_args(request, params))
        except Exception as e:
            await _common.asettle_quietly(self.guard, verdict, error=f"{type(e).__name__}: {e}")
            raise
        await _common.asettle_quietly(self.guard, verdict, error=_tool_error(result))
        return result


def _tool_error(result: Any) -> Any:
    """A tool's error text, when it returned an error message instead of raising."""
    if isinstance(result, ToolMessage) and getattr(result, "status", None) == "error":
        return str(result.content)
    return None
