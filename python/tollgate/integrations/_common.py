"""What every adapter shares: how a tool call is checked, held and settled, the same way
for a library-mode `Guard` and a daemon-mode `Client`."""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple, Optional, Union

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


def deny_text(verdict: Any, note: str = "") -> str:
    """The message a model reads when a call was not run; a refusing human's `note`
    (their reasons) is part of it."""
    text = f"Tollgate blocked the call to `{verdict.tool}`: {verdict.reason}"
    if note:
        text += f". The human who refused it said: {note}"
    return text


def modified_text(tool: str, params: Any, note: str = "") -> str:
    """The message a model reads when a human modified a call that the framework cannot
    run with other arguments: it was not run, and what the human changed it to."""
    text = (f"A human changed the arguments of `{tool}` to {json_text(params)}; Tollgate did not run it with "
            "the original ones. Call it again with the changed arguments if they are what you want.")
    if note:
        text += f" The human said: {note}"
    return text


def held_behind(guard: Any, verdict: Any) -> bool:
    """Whether a library-mode HITL verdict is for a call **held behind** others: the
    session already holds as many calls as it may (`max_held_calls`), so nothing is
    recorded for this one and no human can decide it. The adapters refuse it (the model
    may call again once the others are decided) instead of asking about it. (A daemon
    `Client`'s `check_or_wait` dispatches such a call again until it is held.)"""
    return bool(verdict.verdict == "HITL" and isinstance(guard, Guard) and not guard.is_waiting(verdict))


def held_behind_text(verdict: Any) -> str:
    """The message a model reads for a call held behind others (not run)."""
    return (f"Tollgate did not run `{verdict.tool}`: held behind other calls waiting for a human "
            f"({verdict.reason}; the session already holds as many as it may). Call it again once the others "
            "are decided.")


class Outcome(NamedTuple):
    """What deciding a call (and waiting for a human, if it was held) came to: `verdict`
    (run only if `verdict.allowed`), `params` (what to run it with: a human's `modify`
    changed them), `decision` (the human's word, `""` if none was asked) and `note` (the
    human's note, `""` if none)."""

    verdict: Any
    params: Any
    decision: str = ""
    note: str = ""

    @property
    def modified(self) -> bool:
        """Whether a human's `modify` released the call (with other params)."""
        return bool(self.verdict.allowed and self.decision == "modify")


def _outcome(r: Any) -> Outcome:
    return Outcome(r.verdict, r.params, r.decision, r.note)


def check_or_wait(guard: Union[Guard, Client], tool: str, args: Any, cost: float, *,
                  hitl_timeout: float = 900.0) -> Outcome:
    """Decide; when held, wait for the human: a daemon `Client` waits for an operator
    (`check_or_wait`), a `Guard` asks its `on_hitl` handler."""
    if isinstance(guard, Client):
        return _outcome(guard.check_or_wait(tool, args, cost, timeout=hitl_timeout,
                                            share_params=guard._share(tool, args)))
    v = guard.check(tool, args, cost)
    if v.verdict == "HITL" and guard._on_hitl is not None and not held_behind(guard, v):
        return _outcome(guard.ask_human(v))
    return Outcome(v, args)


async def acheck_or_wait(guard: Union[Guard, Client], tool: str, args: Any, cost: float, *,
                         hitl_timeout: float = 900.0) -> Outcome:
    """`check_or_wait` for async code."""
    if isinstance(guard, Client):
        return _outcome(await guard.acheck_or_wait(tool, args, cost, timeout=hitl_timeout,
                                                   share_params=guard._share(tool, args)))
    v = await guard.acheck(tool, args, cost)
    if v.verdict == "HITL" and guard._on_hitl is not None and not held_behind(guard, v):
        return _outcome(await guard.aask_human(v))
    return Outcome(v, args)


def settle_quietly(guard: Any, verdict: Any, error: Optional[str] = None) -> None:
    """Settle an allowed call at its estimate (with `error` when it failed)."""
    guard.settle(verdict, None, error=error)


async def asettle_quietly(guard: Any, verdict: Any, error: Optional[str] = None) -> None:
    await guard.asettle(verdict, None, error=error)
