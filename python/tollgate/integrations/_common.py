"""What every adapter shares: how a tool call is checked, held and settled, the same way
for a library-mode `Guard` and a daemon-mode `Client`."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Union

from .._guarded import Client, Guard

Cost = Union[float, Callable[[str, Mapping[str, Any]], float]]


def estimate(cost: Cost, tool: str, args: Mapping[str, Any]) -> float:
    """The estimated cost of calling `tool` with `args`: a fixed amount or a function."""
    return float(cost(tool, args)) if callable(cost) else float(cost)


def args_dict(args: Any) -> Any:
    """A tool call's arguments as the params to check: a dict stays a dict; a JSON string
    (what some frameworks carry) is parsed; anything else is checked as it is (and, if it
    is not a JSON object, denied as malformed input)."""
    if isinstance(args, str):
        import json

        try:
            return json.loads(args) if args.strip() else {}
        except ValueError:
            return args
    return args


def json_text(value: Any) -> str:
    """`value` as compact JSON for a model to read (its repr when it is not JSON)."""
    import json

    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def deny_text(verdict: Any) -> str:
    """The message a model reads when a call was not run."""
    return f"Tollgate blocked the call to `{verdict.tool}`: {verdict.reason}"


def check_or_wait(guard: Union[Guard, Client], tool: str, args: Any, cost: float, *,
                  hitl_timeout: float = 900.0) -> Any:
    """Decide; when held, wait for the human: a daemon `Client` waits for an operator
    (`check_or_wait`), a `Guard` asks its `on_hitl` handler. Returns
    `(verdict, params_to_run)`, where `verdict.allowed` says whether to run."""
    if isinstance(guard, Client):
        r = guard.check_or_wait(tool, args, cost, timeout=hitl_timeout, share_params=guard._share(tool, args))
        return r.verdict, r.params
    v = guard.check(tool, args, cost)
    if v.verdict == "HITL" and guard._on_hitl is not None:
        r = guard.ask_human(v)
        return r.verdict, r.params
    return v, args


async def acheck_or_wait(guard: Union[Guard, Client], tool: str, args: Any, cost: float, *,
                         hitl_timeout: float = 900.0) -> Any:
    """`check_or_wait` for async code."""
    if isinstance(guard, Client):
        r = await guard.acheck_or_wait(tool, args, cost, timeout=hitl_timeout,
                                       share_params=guard._share(tool, args))
        return r.verdict, r.params
    v = await guard.acheck(tool, args, cost)
    if v.verdict == "HITL" and guard._on_hitl is not None:
        r = await guard.aask_human(v)
        return r.verdict, r.params
    return v, args


def settle_quietly(guard: Any, verdict: Any, error: Optional[str] = None) -> None:
    """Settle an allowed call at its estimate (with `error` when it failed)."""
    guard.settle(verdict, None, error=error)


async def asettle_quietly(guard: Any, verdict: Any, error: Optional[str] = None) -> None:
    await guard.asettle(verdict, None, error=error)
