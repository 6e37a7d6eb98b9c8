"""CrewAI: tool hooks that check every tool call with Tollgate where the tool's body runs,
and block with Tollgate's reason.

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

**Where the check happens.** CrewAI answers some calls without running the tool's body:
its tool cache, its "I tried reusing the same input" answer to a call identical to the
one before, a tool's usage limit. Its hooks see those calls like any other. So that what
Tollgate counts and charges follows what actually runs, the `PRE_TOOL_CALL` hook puts a
guard on the tool's function (`Tool.func`, what `@tool` makes; every CrewAI path runs the
body through it) and the call is checked there, when and only when the body is about to
run; a call CrewAI answers itself is never checked, counted or charged. For a tool
without such a function the `PRE_TOOL_CALL` hook checks the call itself, as before (and
such a call is counted even if CrewAI then answers it).

- ALLOW: the body runs; after it, its cost (the estimate) is settled (with the error text
  when it raised).
- DENY: the body does not run; the agent reads Tollgate's reason as the tool's result
  (`Tollgate blocked the call to `search`: max_repeat_exceeded`).
- HITL: a library-mode `Guard` asks its `on_hitl` handler (none: blocked, reason
  `hitl_all_calls` etc.); a daemon-mode `Client` waits for the daemon's operator. A
  human's `modify` runs the body with the edited arguments, never the original ones (when
  they cannot be given to it, the call is blocked and the agent told what the human
  changed). A human's refusal reaches the agent with the human's note.
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Any, Dict, Optional, Tuple, Union

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
        # Calls checked in the PRE_TOOL_CALL hook (tools without a function to guard), by
        # the identity of the call's tool_input dict, which CrewAI hands to both hooks of
        # one call (the dict is kept so its id cannot be reused meanwhile): the dict, the
        # verdict, and the text the agent reads instead of a result when it was blocked.
        self._calls: Dict[int, Tuple[Any, Any, Optional[str]]] = {}
        self._lock = threading.Lock()
        self._active = True

    # -- the check where the body runs -------------------------------------------------

    def _guarded(self, tool: Any) -> bool:
        """Put the check on the function that runs `tool`'s body (a `Tool`, or a
        `CrewStructuredTool` made from one); False when there is none."""
        target = getattr(tool, "_original_tool", None) or tool
        f = getattr(target, "func", None)
        if not callable(f):
            return False
        if getattr(f, "_tollgate_hooks", None) is self:
            return True
        name = str(getattr(target, "name", None) or getattr(tool, "name", ""))
        hooks = self

        if inspect.iscoroutinefunction(f):
            @functools.wraps(f)
            async def aguarded(*args: Any, **kwargs: Any) -> Any:
                if not hooks._active:
                    return await f(*args, **kwargs)
                try:
                    out = await _common.acheck_or_wait(hooks.guard, name, *hooks._inputs(name, args, kwargs),
                                                       hitl_timeout=hooks.hitl_timeout)
                except Exception as e:  # noqa: BLE001 - fail closed, whatever went wrong
                    return _common.deny_text(_Failed(name, e))
                run = hooks._released(name, out, args, kwargs)
                if isinstance(run, str):
                    return run
                try:
                    result = await f(*run[0], **run[1])
                except BaseException as e:
                    await hooks.guard.asettle(out.verdict, None, error=f"{type(e).__name__}: {e}")
                    raise
                await hooks.guard.asettle(out.verdict, None)
                return result

            wrapper: Any = aguarded
        else:
            @functools.wraps(f)
            def guarded(*args: Any, **kwargs: Any) -> Any:
                if not hooks._active:
                    return f(*args, **kwargs)
                try:
                    out = _common.check_or_wait(hooks.guard, name, *hooks._inputs(name, args, kwargs),
                                                hitl_timeout=hooks.hitl_timeout)
                except Exception as e:  # noqa: BLE001 - fail closed, whatever went wrong
                    return _common.deny_text(_Failed(name, e))
                run = hooks._released(name, out, args, kwargs)
                if isinstance(run, str):
                    return run
                try:
                    result = f(*run[0], **run[1])
                except BaseException as e:
                    hooks.guard.settle(out.verdict, None, error=f"{type(e).__name__}: {e}")
                    raise
                hooks.guard.settle(out.verdict, None)
                return result

            wrapper = guarded
        wrapper._tollgate_hooks = self
        try:
            object.__setattr__(target, "func", wrapper)
        except Exception:  # noqa: BLE001 - cannot guard the body: check in the hook
            return False
        return True

    def _inputs(self, name: str, args: tuple, kwargs: dict) -> Tuple[Any, float]:
        """The params a body call is checked with (its keyword arguments, and positional
        ones under `args` if any) and its estimated cost."""
        params: Dict[str, Any] = dict(kwargs)
        if args:
            params["args"] = list(args)
        return params, _common.estimate(self.cost, name, params)

    def _released(self, name: str, out: _common.Outcome, args: tuple, kwargs: dict) -> Any:
        """`(args, kwargs)` to run the body with, or the text the agent reads instead."""
        if not out.verdict.allowed:
            return _common.deny_text(out.verdict, out.note)
        if not out.modified:
            return args, kwargs
        params = out.params
        if args or not isinstance(params, dict):
            self.guard.settle(out.verdict, None, error="not run: the edited arguments cannot be given to the tool")
            return _common.modified_text(name, params, out.note)
        return (), dict(params)

    # -- the hooks ---------------------------------------------------------------------

    def before(self, ctx: Any) -> Any:
        """The `PRE_TOOL_CALL` hook: guard the tool's body (the call is checked when it
        runs); for a tool without a function to guard, check the call now: False (blocked)
        unless Tollgate allows it. CrewAI swallows a hook's exceptions and runs the tool
        anyway, so any error here blocks the call instead (fail closed)."""
        try:
            if self._guarded(ctx.tool):
                return None
            return self._before(ctx)
        except Exception as e:  # noqa: BLE001 - fail closed, whatever went wrong
            failed = _Failed(ctx.tool_name, e)
            with self._lock:
                self._calls[id(ctx.tool_input)] = (ctx.tool_input, failed, _common.deny_text(failed))
            return False

    def _before(self, ctx: Any) -> Any:
        args = ctx.tool_input if isinstance(ctx.tool_input, dict) else _common.args_dict(ctx.tool_input)
        cost = _common.estimate(self.cost, ctx.tool_name, args if isinstance(args, dict) else {})
        out = _common.check_or_wait(self.guard, ctx.tool_name, dict(args) if isinstance(args, dict) else args,
                                    cost, hitl_timeout=self.hitl_timeout)
        verdict, params = out.verdict, out.params
        blocked: Optional[str] = None if verdict.allowed else _common.deny_text(verdict, out.note)
        if out.modified and not (isinstance(params, dict) and isinstance(ctx.tool_input, dict)):
            # A human changed the arguments and they cannot be put in place: never run
            # the original ones.
            self.guard.settle(verdict, None, error="not run: the edited arguments cannot be given to the tool")
            blocked = _common.modified_text(ctx.tool_name, params, out.note)
        with self._lock:
            self._calls[id(ctx.tool_input)] = (ctx.tool_input, verdict, blocked)
        if blocked is not None:
            return False
        if out.modified:
            # A human modified the call: CrewAI runs the tool with this dict, edited in place.
            ctx.tool_input.clear()
            ctx.tool_input.update(params)
        return None

    def after(self, ctx: Any) -> Any:
        """The `POST_TOOL_CALL` hook, for calls the `PRE_TOOL_CALL` hook checked: settle an
        allowed call; for a blocked one, replace the result with Tollgate's reason."""
        with self._lock:
            entry = self._calls.pop(id(ctx.tool_input), None)
        if entry is None:
            return None
        _, verdict, blocked = entry
        if blocked is not None:
            return blocked
        self.guard.settle(verdict, None)
        return None

    def register(self) -> "TollgateHooks":
        """Register both hooks globally (every crew, every agent). Returns self."""
        self._active = True
        if _DISPATCHER:
            register(InterceptionPoint.PRE_TOOL_CALL, self.before)
            register(InterceptionPoint.POST_TOOL_CALL, self.after)
        else:  # pragma: no cover - older CrewAI
            from crewai.hooks import register_after_tool_call_hook, register_before_tool_call_hook

            register_before_tool_call_hook(self.before)
            register_after_tool_call_hook(self.after)
        return self

    def unregister(self) -> None:
        """Remove both hooks (and stop checking in the tools' bodies they guarded)."""
        self._active = False
        if _DISPATCHER:
            unregister(InterceptionPoint.PRE_TOOL_CALL, self.before)
            unregister(InterceptionPoint.POST_TOOL_CALL, self.after)
        else:  # pragma: no cover - older CrewAI
            from crewai.hooks import unregister_after_tool_call_hook, unregister_before_tool_call_hook

            unregister_before_tool_call_hook(self.before)
            unregister_after_tool_call_hook(self.after)
