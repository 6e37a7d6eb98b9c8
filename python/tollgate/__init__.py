"""Tollgate for Python: decide, before an AI agent runs a tool, whether it may.

The decisions are the Rust core's (SP/1.0), not a port: `Guard` runs it in process
(library mode), `connect()` talks to `tollgate serve` (daemon mode). Both return a
`Verdict` from `check(tool, params, estimated_cost_usd)` and guard plain functions with
`@guard.tool`, which raises `ToolDenied` or `HeldForHuman` instead of running them.
Framework adapters live in `tollgate.integrations`.
"""

from ._native import (
    Released,
    Settlement,
    VectorOutcome,
    Verdict,
    __version__,
    canonical_hash,
    canonical_json,
    check_vector,
    run_vectors,
)
from ._errors import ConnectError, HeldForHuman, PolicyError, TollgateError, ToolBlocked, ToolDenied
from ._guarded import Client, Decision, Guard, Operator, aconnect, connect, operator

__all__ = [
    "Guard",
    "Client",
    "Operator",
    "Decision",
    "connect",
    "aconnect",
    "operator",
    "Verdict",
    "Released",
    "Settlement",
    "VectorOutcome",
    "TollgateError",
    "ConnectError",
    "PolicyError",
    "ToolBlocked",
    "ToolDenied",
    "HeldForHuman",
    "canonical_json",
    "canonical_hash",
    "check_vector",
    "run_vectors",
    "__version__",
]
