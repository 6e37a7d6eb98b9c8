"""`Guard` (library mode) and `Client` (daemon mode): the native objects, plus the
`@guard.tool` decorator and the async variants that belong in Python."""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Tuple, Union, cast

from . import _native
from ._errors import HeldForHuman, ToolDenied

__all__ = ["Guard", "Client", "Operator", "Decision", "connect", "aconnect", "operator"]


@dataclass(frozen=True)
class Decision:
    """A human's decision on a held call, as returned by a library-mode `on_hitl`
    handler: `decision` is `approve`, `reject`, `modify`, `defer` or `escalate`;
    `params` are the successor's params for `modify`; `operator` is recorded in the audit
    log; `note` (the human's words, at most 1024 bytes) is audited with the decision and,
    for a refusal, given to the model with it."""

    decision: str
    operator: str = "on_hitl"
    params: Optional[Mapping[str, Any]] = None
    note: str = ""


def call_params(sig: inspect.Signature, args: tuple, kwargs: dict) -> dict:
    """The params a decorated function's call is checked with: its arguments by name,
    defaults applied (so the same effective call always hashes the same)."""
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def params_maker(sig: inspect.Signature) -> Callable[[tuple, dict], dict]:
    """`call_params` for `sig`, with a fast path for the common signature (named
    parameters only, no `*args`/`**kwargs`/positional-only): the same dict, without
    `Signature.bind` on every call."""
    plain = all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD or p.kind is inspect.Parameter.KEYWORD_ONLY
                for p in sig.parameters.values())
    if not plain:
        return lambda args, kwargs: call_params(sig, args, kwargs)
    names = [p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    defaults = {p.name: p.default for p in sig.parameters.values() if p.default is not inspect.Parameter.empty}
    order = list(sig.parameters)

    def make(args: tuple, kwargs: dict) -> dict:
        if len(args) > len(names) or any(k not in sig.parameters for k in kwargs):
            return call_params(sig, args, kwargs)  # raises the usual TypeError
        got = dict(zip(names, args))
        for k, v in kwargs.items():
            if k in got:
                return call_params(sig, args, kwargs)
            got[k] = v
        if len(got) == len(order):
            return {k: got[k] for k in order}
        out = {}
        for k in order:
            if k in got:
                out[k] = got[k]
            elif k in defaults:
                out[k] = defaults[k]
            else:
                return call_params(sig, args, kwargs)  # a missing argument: TypeError
        return out

    return make


def call_with(sig: inspect.Signature, fn: Callable, params: Mapping[str, Any]) -> Any:
    """Call `fn` with `params` (argument names to values), as `call_params` made them."""
    bound = inspect.BoundArguments(sig, dict(params))  # type: ignore[arg-type]
    return fn(*bound.args, **bound.kwargs)


class _Decorating:
    """The `tool` decorator, over `_dispatch` / `_adispatch` and `settle` / `asettle`."""

    if TYPE_CHECKING:  # provided by the classes that mix this in

        def _dispatch(self, tool: str, params: dict, cost: float) -> Tuple[Any, Any]: ...

        async def _adispatch(self, tool: str, params: dict, cost: float) -> Tuple[Any, Any]: ...

        def settle(self, call: Any, actual_cost_usd: Optional[float] = None, error: Optional[str] = None) -> Any: ...

        def asettle(self, call: Any, actual_cost_usd: Optional[float] = None,
                    error: Optional[str] = None) -> Any: ...

    def tool(
        self,
        fn: Optional[Callable] = None,
        *,
        name: Optional[str] = None,
        cost: float = 0.0,
        cost_of: Optional[Callable[[Any], float]] = None,
    ) -> Any:
        """Guard a plain function (sync or async): each call is checked first, with the
        function's arguments (by name, defaults applied) as its params and `cost` as its
        estimated cost. On ALLOW the function runs and its cost is settled
        (`cost_of(result)`, or the estimate); if it raises, the error is reported and
        re-raised. On DENY it raises `ToolDenied(reason)` without running; on HITL it
        waits for a human (daemon mode; library mode with an `on_hitl` handler) or raises
        `HeldForHuman`. A human's `modify` runs the function with the edited arguments.

        Use as `@guard.tool` or `@guard.tool(name="search", cost=0.01)`.
        """

        def wrap(f: Callable) -> Callable:
            sig = inspect.signature(f)
            tool_name = name or f.__name__
            make_params = params_maker(sig)

            if inspect.iscoroutinefunction(f):

                @functools.wraps(f)
                async def arun(*args: Any, **kwargs: Any) -> Any:
                    params = make_params(args, kwargs)
                    verdict, run_params = await self._adispatch(tool_name, params, cost)
                    try:
                        result = await (f(*args, **kwargs) if run_params is params else call_with(sig, f, run_params))
                    except BaseException as e:
                        await self.asettle(verdict, None, error=f"{type(e).__name__}: {e}")
                        raise
                    await self.asettle(verdict, cost_of(result) if cost_of else None)
                    return result

                return arun

            @functools.wraps(f)
            def run(*args: Any, **kwargs: Any) -> Any:
                params = make_params(args, kwargs)
                verdict, run_params = self._dispatch(tool_name, params, cost)
                try:
                    # The checked params are the call's own arguments unless a human
                    # modified them.
                    result = f(*args, **kwargs) if run_params is params else call_with(sig, f, run_params)
                except BaseException as e:
                    self.settle(verdict, None, error=f"{type(e).__name__}: {e}")
                    raise
                self.settle(verdict, cost_of(result) if cost_of else None)
                return result

            return run

        return wrap(fn) if fn is not None else wrap


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _raise_for(verdict: Any, note: str = "") -> None:
    if verdict.verdict == "HITL":
        raise HeldForHuman(verdict, note)
    raise ToolDenied(verdict, note)


class Guard(_native.Guard, _Decorating):
    """Library mode: the SP/1.0 decision core in process, over one session.

    Keyword arguments (all optional): `budget_usd` (1.0; 0 disables the budget rules),
    `max_repeat_calls` (3; 0 disables), `hitl_mode` (`never`, `on_deny`, `on_threshold`,
    `always`), `settlement` (`conservative` or `actual`), `error_amplification`,
    `timeout_seconds`, `window_duration_s`, `window_max_calls`, `max_total_calls`,
    `probabilistic_deny`, `deny_jitter_ratio`, `hitl_budget_threshold`, `nonce_window`,
    `max_reservations`, `max_held_calls` (16: how many calls may be held for a human at
    once, each decided on its own; 1 is SP/1.0.1's single held call, where a reject makes
    the next call DENY and trips the circuit); `audit_log` (a directory: every change is written to a signed
    audit log there, durably, before the call returns) with `audit_key` (a key file from
    `tollgate keygen`), and `session_id`, `agent_id`, `organization_id` for its entries;
    `policy`: a Cedar policy set to enforce with the guards (docs/policy.md), as a path to
    a TOML file with a `[policy]` section (a `tollgate serve` configuration or `mcp.toml`
    will do; its relative paths are read from the file's directory) or a dict with the
    section's keys, `files` (a list, in set order), `default` (`"allow"` or `"deny"`),
    `schema`, `trip_on_refusal` (relative paths from the current directory); a set that
    does not load raises `PolicyError` naming every finding's `file:line:column`;
    `on_hitl`: a function (or an async function) called with a held `Verdict` that
    returns a `Decision` (or a decision word), which `@guard.tool` and the AutoGen and
    CrewAI adapters use to resolve held calls (LangGraph and the OpenAI Agents SDK have
    approvals of their own: `interrupt()`, `needs_approval`); in async code it never blocks the event loop (an async handler is
    awaited, a plain one runs in the loop's default executor).
    """

    _on_hitl: Optional[Callable[[Any], Union[Decision, str]]]
    _audited: bool

    def __new__(cls, *, on_hitl: Optional[Callable[[Any], Union[Decision, str]]] = None, **kwargs: Any) -> "Guard":
        self = cast("Guard", super().__new__(cls, **kwargs))
        self._on_hitl = on_hitl
        self._audited = kwargs.get("audit_log") is not None
        return self

    def __init__(self, **kwargs: Any) -> None:  # everything is done in __new__
        pass

    async def acheck(self, tool: str, params: Any, estimated_cost_usd: float = 0.0, *, nonce: Optional[int] = None) -> Any:
        """`check` for async code. Without an audit log the check takes microseconds and
        runs inline; with one it waits for a disk sync, so it runs in the loop's default
        executor and the loop keeps running."""
        if not self._audited:
            return self.check(tool, params, estimated_cost_usd, nonce=nonce)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            None, functools.partial(self.check, tool, params, estimated_cost_usd, nonce=nonce)
        )

    async def asettle(self, call: Any, actual_cost_usd: Optional[float] = None, error: Optional[str] = None) -> Any:
        """`settle` for async code (in the default executor when there is an audit log)."""
        if not self._audited:
            return self.settle(call, actual_cost_usd, error)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, functools.partial(self.settle, call, actual_cost_usd, error))

    def ask_human(self, verdict: Any) -> Any:
        """Resolve a held verdict with the `on_hitl` handler; returns a `Released`.
        Raises `HeldForHuman` when there is no handler. An async handler is run to
        completion here when no event loop runs in this thread (inside one, use
        `aask_human`: this raises `TypeError` rather than block the loop)."""
        if self._on_hitl is None:
            raise HeldForHuman(verdict)
        d = self._on_hitl(verdict)
        if inspect.isawaitable(d):
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                d = asyncio.run(_awaited(d))
            else:
                if inspect.iscoroutine(d):
                    d.close()
                raise TypeError("an async on_hitl handler inside a running event loop: use aask_human "
                                "(the async tool paths do)")
        return self._resolve_with(verdict, d)

    async def aask_human(self, verdict: Any) -> Any:
        """`ask_human` for async code; the event loop keeps running while the human
        decides. An async `on_hitl` is awaited; a plain function runs in the loop's default
        executor (a handler that waits for a person would otherwise freeze the loop)."""
        if self._on_hitl is None:
            raise HeldForHuman(verdict)
        handler = self._on_hitl
        if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(getattr(handler, "__call__", None)):
            d = await handler(verdict)
        else:
            loop = asyncio.get_running_loop()
            d = await loop.run_in_executor(None, handler, verdict)
            if inspect.isawaitable(d):
                d = await d
        return self._resolve_with(verdict, d)

    def _resolve_with(self, verdict: Any, d: Any) -> Any:
        if isinstance(d, str):
            d = Decision(d)
        return self.resolve(verdict, d.decision, operator=d.operator, params=d.params, note=d.note)

    def _dispatch(self, tool: str, params: dict, cost: float) -> Tuple[Any, Any]:
        v = self.check(tool, params, cost)
        if v.allowed:
            return v, params
        if v.verdict == "HITL" and self._on_hitl is not None and self.is_waiting(v):
            r = self.ask_human(v)
            if r.allowed:
                return r.verdict, r.params
            _raise_for(r.verdict, r.note)
        _raise_for(v)
        raise AssertionError("unreachable")

    async def _adispatch(self, tool: str, params: dict, cost: float) -> Tuple[Any, Any]:
        v = await self.acheck(tool, params, cost)
        if v.allowed:
            return v, params
        if v.verdict == "HITL" and self._on_hitl is not None and self.is_waiting(v):
            r = await self.aask_human(v)
            if r.allowed:
                return r.verdict, r.params
            _raise_for(r.verdict, r.note)
        _raise_for(v)
        raise AssertionError("unreachable")


class Client(_native.Client, _Decorating):
    """Daemon mode: a session with `tollgate serve`, over its socket or over gRPC with
    mutual TLS (see `connect`); the same object, methods and fail-closed contract either
    way."""

    _hitl_timeout: float
    _share_params: Union[bool, Callable[[str, Any], bool]]
    _wait_for_human: bool

    def __new__(cls, *, hitl_timeout: float = 900.0, share_params: Union[bool, Callable[[str, Any], bool]] = True,
                wait_for_human: bool = True, **kwargs: Any) -> "Client":
        self = cast("Client", super().__new__(cls, **kwargs))
        self._hitl_timeout = hitl_timeout
        self._share_params = share_params
        self._wait_for_human = wait_for_human
        return self

    def __init__(self, **kwargs: Any) -> None:  # everything is done in __new__
        pass

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _share(self, tool: str, params: Any) -> bool:
        s = self._share_params
        return bool(s(tool, params)) if callable(s) else bool(s)

    def _dispatch(self, tool: str, params: dict, cost: float) -> Tuple[Any, Any]:
        if not self._wait_for_human:
            v = self.check(tool, params, cost)
            if not v.allowed:
                _raise_for(v)
            return v, params
        r = self.check_or_wait(tool, params, cost, timeout=self._hitl_timeout, share_params=self._share(tool, params))
        if not r.allowed:
            _raise_for(r.verdict, r.note)
        return r.verdict, r.params

    async def _adispatch(self, tool: str, params: dict, cost: float) -> Tuple[Any, Any]:
        if not self._wait_for_human:
            v = await self.acheck(tool, params, cost)
            if not v.allowed:
                _raise_for(v)
            return v, params
        r = await self.acheck_or_wait(
            tool, params, cost, timeout=self._hitl_timeout, share_params=self._share(tool, params)
        )
        if not r.allowed:
            _raise_for(r.verdict, r.note)
        return r.verdict, r.params


Operator = _native.Operator


def _secret(secret: Union[str, bytes, None], secret_file: Union[str, os.PathLike, None]) -> bytes:
    if (secret is None) == (secret_file is None):
        raise ValueError("give exactly one of secret and secret_file")
    if secret_file is not None:
        # The secret is the file's text with surrounding whitespace removed (docs/protocol.md §3).
        with open(secret_file, "rb") as f:
            return f.read().strip()
    if isinstance(secret, str):
        return secret.encode()
    return bytes(cast(bytes, secret))


#: The largest PEM file `connect` reads (a CA bundle of a few hundred certificates fits).
MAX_PEM_BYTES = 1 << 20


def _pem(path: Union[str, os.PathLike], what: str) -> bytes:
    """A PEM file's bytes, at most `MAX_PEM_BYTES` (`ValueError` beyond; `OSError` when
    it cannot be read). Its content is checked by the TLS layer when connecting."""
    with open(path, "rb") as f:
        data = f.read(MAX_PEM_BYTES + 1)
    if len(data) > MAX_PEM_BYTES:
        raise ValueError(f"{what}: `{os.fspath(path)}` is larger than {MAX_PEM_BYTES} bytes, not a PEM file")
    return data


def _organization(organization: Optional[str], organization_id: Optional[str]) -> Optional[str]:
    if organization is not None and organization_id is not None:
        raise ValueError("give one of organization and organization_id (two spellings of the same thing)")
    return organization if organization is not None else organization_id


def connect(
    *,
    agent_id: str,
    socket: Union[str, os.PathLike, None] = None,
    secret_file: Union[str, os.PathLike, None] = None,
    secret: Union[str, bytes, None] = None,
    grpc: Optional[str] = None,
    ca: Union[str, os.PathLike, None] = None,
    cert: Union[str, os.PathLike, None] = None,
    key: Union[str, os.PathLike, None] = None,
    server_name: Optional[str] = None,
    organization: Optional[str] = None,
    organization_id: Optional[str] = None,
    framework: str = "python",
    agent_version: str = "",
    timeout: float = 2.0,
    heartbeat_interval: float = 30.0,
    session_id: Optional[str] = None,
    hitl_timeout: float = 900.0,
    share_params: Union[bool, Callable[[str, Any], bool]] = True,
    wait_for_human: bool = True,
) -> Client:
    """Connect to `tollgate serve` and register a session (or resume `session_id`), over
    one of its two bindings:

    - its Unix socket: `socket`, with the organization's agents' secret, `secret_file`
      (the daemon's `secrets/<org>.secret`) or `secret`;
    - gRPC with mutual TLS: `grpc` (the daemon's `host:port`), with `ca` (the CA
      certificate that issued the daemon's certificate), `cert` and `key` (this agent's
      certificate and private key), PEM files. The daemon's certificate must be valid for
      `server_name` (default: the host part of `grpc`). There is no secret: the client
      certificate names the organization.

    `organization` (or `organization_id`) is the agent's organization: `default` on the
    socket; over gRPC, by default the one the certificate names (another one is refused).
    `timeout` bounds every reply (seconds); heartbeats run every `heartbeat_interval`
    seconds (0: none). `@client.tool` waits up to `hitl_timeout` seconds for a human on
    HITL (unless `wait_for_human` is false), showing operators the params when
    `share_params` (a bool, or a predicate on `(tool, params)`) allows. Either way the
    same `Client` comes back, with the same fail-closed contract.

    Raises `ValueError` for a bad combination of arguments, `OSError` when a file cannot
    be read, and `ConnectError` when the daemon cannot be reached or refuses the
    registration: `args[0]` is the fail-closed reason (`fail_closed:daemon_unreachable`,
    `fail_closed:authentication_failed`, `fail_closed:tls` for a TLS failure, ...).
    """
    org = _organization(organization, organization_id)
    tls_given = any(x is not None for x in (ca, cert, key, server_name))
    if (socket is None) == (grpc is None):
        raise ValueError("give exactly one of socket and grpc")
    transport: dict
    if socket is not None:
        if tls_given:
            raise ValueError("ca, cert, key and server_name are for grpc, not socket")
        transport = {"socket": os.fspath(socket), "secret": _secret(secret, secret_file)}
    else:
        if secret is not None or secret_file is not None:
            raise ValueError("secret and secret_file are not used over grpc: the client certificate authenticates")
        if ca is None or cert is None or key is None:
            raise ValueError("grpc needs ca (the CA certificate that issued the daemon's certificate), "
                             "cert and key (this agent's certificate and private key): PEM files")
        transport = {"grpc": grpc, "server_name": server_name, "ca_pem": _pem(ca, "ca"),
                     "cert_pem": _pem(cert, "cert"), "key_pem": _pem(key, "key")}
    return Client(
        **transport,
        agent_id=agent_id,
        organization=org,
        framework=framework,
        agent_version=agent_version,
        timeout=timeout,
        heartbeat_interval=heartbeat_interval,
        session_id=session_id,
        hitl_timeout=hitl_timeout,
        share_params=share_params,
        wait_for_human=wait_for_human,
    )


async def aconnect(**kwargs: Any) -> Client:
    """`connect`, for async code (socket or gRPC, the same arguments): the connection is
    made in the loop's default executor."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, functools.partial(connect, **kwargs))


def operator(
    *,
    socket: Union[str, os.PathLike, None] = None,
    secret_file: Union[str, os.PathLike, None] = None,
    secret: Union[str, bytes, None] = None,
    organization: Optional[str] = None,
    organization_id: Optional[str] = None,
    timeout: float = 2.0,
    grpc: Optional[str] = None,
    ca: Union[str, os.PathLike, None] = None,
    cert: Union[str, os.PathLike, None] = None,
    key: Union[str, os.PathLike, None] = None,
    server_name: Optional[str] = None,
) -> Any:
    """Connect as an operator (with the organization's **operator** secret, the daemon's
    `secrets/<org>.operator.secret`), to list held calls (`pending()`) and decide them
    (`decide(session_id, "approve", operator="alice")`).

    Operators use the socket only: the gRPC binding serves agents, not operators'
    requests (docs/protocol.md §8.5), so `grpc` (or `ca`, `cert`, `key`, `server_name`)
    raises `ValueError`. An agent connected over gRPC is decided by an operator on the
    socket (or the control plane's console) like any other.
    """
    if any(x is not None for x in (grpc, ca, cert, key, server_name)):
        raise ValueError("operators are not served over grpc: connect the operator to the daemon's socket "
                         "with the operator secret (or use the control plane); agents may use grpc")
    if socket is None:
        raise ValueError("an operator needs socket: the daemon's Unix socket")
    org = _organization(organization, organization_id)
    return Operator(socket=os.fspath(socket), secret=_secret(secret, secret_file),
                    organization="default" if org is None else org, timeout=timeout)
