"""The exceptions a guarded tool raises instead of running."""

from __future__ import annotations

from typing import Any

from ._native import ConnectError, PolicyError, TollgateError

__all__ = ["TollgateError", "ConnectError", "PolicyError", "ToolBlocked", "ToolDenied", "HeldForHuman"]


class ToolBlocked(TollgateError):
    """A guarded tool did not run. The base of `ToolDenied` and `HeldForHuman`.

    `verdict` is the `Verdict` that stopped it, `reason` its stable reason string, `tool`
    the tool's name and `note` the note of the human who refused it (`""` if none); the
    message ends with the note, so a model that reads the error reads the human's words.
    """

    def __init__(self, verdict: Any, note: str = "") -> None:
        self.verdict = verdict
        self.reason: str = verdict.reason
        self.tool: str = verdict.tool
        self.note: str = note or ""
        text = self._message()
        if self.note:
            text += f" (the human's note: {self.note})"
        super().__init__(text)

    def _message(self) -> str:
        return f"tool `{self.tool}` blocked: {self.reason}"


class ToolDenied(ToolBlocked):
    """The guard said DENY (or failed closed): the tool did not run. `reason` says why,
    e.g. `max_repeat_exceeded`, `budget_overrun`, `fail_closed:daemon_unreachable`."""

    def _message(self) -> str:
        return f"tool `{self.tool}` denied: {self.reason}"


class HeldForHuman(ToolBlocked):
    """The guard said HITL and nobody was there to decide: the tool did not run. The call
    can be released later with the held verdict (`verdict`), e.g.
    `guard.resolve(err.verdict, "approve", operator="alice")` in library mode."""

    def _message(self) -> str:
        return f"tool `{self.tool}` held for a human: {self.reason}"
