"""CrewAI: a `PRE_TOOL_CALL` hook that blocks with Tollgate's reason and a
`POST_TOOL_CALL` hook that settles the call.

```python
from tollgate.integrations.crewai import TollgateHooks

hooks = TollgateHooks(guard, cost=0.01).register()   # for every crew in the process
...
hooks.unregister()
```

The hooks are registered with CrewAI's interception dispatcher
(`crewai.hooks.dispatch.register(InterceptionPoint.PRE_TOOL_CALL, ...)`, what
`@on(InterceptionPoint.PRE_TOOL_CALL)` does); releases without it get the legacy
`register_before_tool_call_hook` / `register_after_tool_call_hook`.

- ALLOW: the tool runs; after it, its cost (the estimate) is settled (with the error text
  when CrewAI reports the tool failed).
- DENY: the pre hook blocks the call (the tool body never runs) and the post hook puts
  Tollgate's reason in the result the agent reads (`Tollgate blocked the call to
  `search`: max_repeat_exceeded`).
- HITL: a library-mode `Guard` asks its `on_hitl` handler (none: blocked, reason
  `hitl_all_calls` etc.); a daemon-mode `Client` waits for the daemon's operator. A
  human's `modify` edits the tool input in place, so the tool runs with the new
  arguments.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Tuple, Union

from .._guarded import Client, Guard
from . import _common

try:  # CrewAI 1.x: the interception dispatcher
    from crewai.hooks.dispatch import InterceptionPoint, register, unregister

    _DISPATCHER = True
except ImportError:  # older releases: the legacy decorators' registries
    _DISPATCHER = False

__all__ = ["TollgateHooks"]


class _Failed:
    """Stands for a verdict when checking the call raised: blocked."""

    allowed = False
    verdict = "DENY"

    def __init__(self, tool: str, error: BaseException) -> None:
        self.tool = tool
        self.reason = f"fail_closed:hook_error ({type(error).__name__}: {error})"


class TollgateHooks:
    """A pair of CrewAI tool hooks backed by `guard` (a `tollgate.Guard` or a
    `tollgate.Client`). `cost`: a call's estimated cost (a number or a function of
    `(tool_name, args)`)."""

    def __init__(self, guard: Union[Guard, Client], *, cost: _common.Cost = 0.0, hitl_timeout: float = 900.0) -> None:
        self.guard = guard
        self.cost = cost
        self.hitl_timeout = hitl_timeout
        # By the identity of the call's tool_input dict, which CrewAI hands to both hooks
        # of one call (the dict is kept so its id cannot be reused meanwhile).
        self._calls: Dict[int, Tuple[Any, Any]] = {}
        self._lock = threading.Lock()

    def before(self, ctx: Any) -> Any:
        """The `PRE_TOOL_CALL` hook: False (blocked) unless Tollgate allows the call.
        CrewAI swallows a hook's exceptions and runs the tool anyway, so any error here
        blocks the call instead (fail closed)."""
        try:
            return self._before(ctx)
        except Exception as e:  # noqa: BLE001 - fail closed, whatever went wrong
            with self._lock:
                self._calls[id(ctx.tool_input)] = (ctx.tool_input, _Failed(ctx.tool_name, e))
            return False

    def _before(self, ctx: Any) -> Any:
        args = ctx.tool_input if isinstance(ctx.tool_input, dict) else _common.args_dict(ctx.tool_input)
        cost = _common.estimate(self.cost, ctx.tool_name, args if isinstance(args, dict) else {})
        verdict, params = _common.check_or_wait(self.guard, ctx.tool_name, dict(args) if isinstance(args, dict) else args,
                                                cost, hitl_timeout=self.hitl_timeout)
        with self._lock:
            self._calls[id(ctx.tool_input)] = (ctx.tool_input, verdict)
        if not verdict.allowed:
            return False
        if isinstance(params, dict) and isinstance(ctx.tool_input, dict) and params != ctx.tool_input:
            # A human modified the call: CrewAI runs the tool with this dict, edited in place.
            ctx.tool_input.clear()
            ctx.tool_input.update(params)
        return None

    def after(self, ctx: Any) -> Any:
        """The `POST_TOOL_CALL` hook: settle an allowed call; for a blocked one, replace
        the result with Tollgate's reason."""
        with self._lock:
            entry = self._calls.pop(id(ctx.tool_input), None)
        if entry is None:
            return None
        verdict = entry[1]
        if not verdict.allowed:
            return _common.deny_text(verdict)
        self.guard.settle(verdict, None)
        return None

    def register(self) -> "TollgateHooks":
        """Register both hooks globally (every crew, every agent). Returns self."""
        if _DISPATCHER:
            register(InterceptionPoint.PRE_TOOL_CALL, self.before)
            register(InterceptionPoint.POST_TOOL_CALL, self.after)
        else:  # pragma: no cover - older CrewAI
            from crewai.hooks import register_after_tool_call_hook, register_before_tool_call_hook

            register_before_tool_call_hook(self.before)
            register_after_tool_call_hook(self.after)
        return self

    def unregister(self) -> None:
        """Remove both hooks."""
        if _DISPATCHER:
            unregister(InterceptionPoint.PRE_TOOL_CALL, self.before)
            unregister(InterceptionPoint.POST_TOOL_CALL, self.after)
        else:  # pragma: no cover - older CrewAI
            from crewai.hooks import unregister_after_tool_call_hook, unregister_before_tool_call_hook

            unregister_before_tool_call_hook(self.before)
            unregister_after_tool_call_hook(self.after)
