"""CrewAI: a real `Crew` with one `Agent`, offline, with a scripted `BaseLLM` that
answers in ReAct text (no function calling)."""

from __future__ import annotations

import json
import os

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

import pytest  # noqa: E402
from crewai import Agent, Crew, Task  # noqa: E402
from crewai.llms.base_llm import BaseLLM  # noqa: E402
from crewai.tools import tool  # noqa: E402

import tollgate  # noqa: E402
from tollgate.integrations.crewai import TollgateHooks  # noqa: E402


class ScriptedLLM(BaseLLM):
    """Answers each call with the next scripted ReAct step; the tool results the agent
    feeds back are recorded in `seen`."""

    script: list = []
    seen: list = []

    def call(self, messages, tools=None, callbacks=None, available_functions=None, from_task=None,
             from_agent=None, response_model=None):
        self.seen.append(str(messages))
        step = self.script.pop(0) if self.script else None
        if step is None:
            return "Thought: I now know the final answer\nFinal Answer: done"
        # A step is the search's input, or (tool name, input) for another tool.
        name, args = step if isinstance(step, tuple) else ("search", step)
        return f"Thought: I will use {name}\nAction: {name}\nAction Input: {json.dumps(args)}"

    def supports_function_calling(self):
        return False

    def supports_stop_words(self):
        return False

    def get_context_window_size(self):
        return 8192


@pytest.fixture
def hooks_of():
    registered = []

    def make(guard, **kw):
        h = TollgateHooks(guard, **kw).register()
        registered.append(h)
        return h

    yield make
    for h in registered:
        h.unregister()


FINAL = None


def run_crew(steps, ran, tasks=1):
    @tool("search")
    def search(q: str) -> str:
        """Search the web for q."""
        ran.append(q)
        return f"results for {q}"

    llm = ScriptedLLM(model="scripted", script=list(steps), seen=[])
    agent = Agent(role="researcher", goal="find", backstory="", llm=llm, tools=[search], max_iter=len(steps) + 2,
                  verbose=False)
    work = [Task(description=f"find things ({i})", expected_output="anything", agent=agent) for i in range(tasks)]
    Crew(agents=[agent], tasks=work, verbose=False).kickoff()
    return llm.seen


def test_an_allowed_call_runs_and_is_settled(hooks_of):
    guard = tollgate.Guard(budget_usd=1.0)
    hooks_of(guard, cost=0.25)
    ran = []
    run_crew([{"q": "rust"}], ran)
    assert ran == ["rust"]
    assert guard.budget_remaining_usd == 0.75


def test_a_repeated_call_is_blocked_with_the_reason_and_never_runs(hooks_of):
    # One identical call per task: CrewAI itself refuses an identical call within one
    # task's loop, so the repeats Tollgate counts here span tasks (one session).
    guard = tollgate.Guard(max_repeat_calls=3)
    hooks_of(guard)
    ran = []
    seen = run_crew([{"q": "same"}, FINAL] * 4, ran, tasks=4)
    assert ran == ["same"] * 3
    assert any("max_repeat_exceeded" in str(s) for s in seen)


def test_a_budget_overrun_is_blocked(hooks_of):
    guard = tollgate.Guard(budget_usd=0.5)
    hooks_of(guard, cost=0.3)
    ran = []
    seen = run_crew([{"q": "a"}, {"q": "b"}], ran)
    assert ran == ["a"]
    assert any("budget_overrun" in str(s) for s in seen)


def test_a_held_call_runs_after_a_human_modifies_it(hooks_of):
    guard = tollgate.Guard(hitl_mode="always",
                           on_hitl=lambda v: tollgate.Decision("modify", operator="alice", params={"q": "safe"}))
    hooks_of(guard)
    ran = []
    run_crew([{"q": "risky"}], ran)
    assert ran == ["safe"]


def test_a_failing_check_blocks_the_call(hooks_of):
    class Broken:
        def check(self, *a, **k):
            raise RuntimeError("boom")

    hooks_of(Broken())
    ran = []
    seen = run_crew([{"q": "x"}], ran)
    assert ran == []
    assert any("fail_closed:hook_error" in str(s) for s in seen)


def test_the_example_runs():
    from _examples import run_example

    out = run_example("crewai_example.py")
    assert "held for a human: delete {'path': '/'}" in out
    assert "delete ran with path=/tmp/build" in out


def test_calls_crewai_answers_itself_are_not_charged(hooks_of):
    """Issue 16 §6: four identical calls in one task. CrewAI runs the body once and
    answers the next three itself (its "I tried reusing the same input" check); Tollgate
    counts and charges what ran: one call."""
    guard = tollgate.Guard(budget_usd=1.0, max_repeat_calls=2)
    hooks_of(guard, cost=0.01)
    ran = []
    seen = run_crew([{"q": "same"}] * 4, ran)
    assert ran == ["same"]
    assert guard.calls == 1
    assert guard.budget_remaining_usd == pytest.approx(0.99)
    assert not any("max_repeat_exceeded" in s for s in seen)
    assert not guard.circuit_tripped


def test_calls_crewai_answers_from_its_cache_are_not_charged(hooks_of):
    """Issue 16 §6: CrewAI's tool cache answers a repeat of an earlier call (not the one
    just before, so its repeated-input check does not fire): not run, not counted, not
    charged."""
    guard = tollgate.Guard(budget_usd=1.0, max_repeat_calls=0)
    hooks_of(guard, cost=0.01)
    ran = []

    @tool("search")
    def search(q: str) -> str:
        """Search the web for q."""
        ran.append(q)
        return f"results for {q}"

    steps = [{"q": "a"}, {"q": "b"}, {"q": "a"}, {"q": "b"}]
    llm = ScriptedLLM(model="scripted", script=list(steps), seen=[])
    agent = Agent(role="researcher", goal="find", backstory="", llm=llm, tools=[search], max_iter=8, verbose=False)
    Crew(agents=[agent], tasks=[Task(description="find", expected_output="x", agent=agent)], cache=True,
         verbose=False).kickoff()
    assert ran == ["a", "b"]
    assert guard.calls == 2
    assert guard.budget_remaining_usd == pytest.approx(0.98)


def test_a_reject_note_reaches_the_agent(hooks_of):
    guard = tollgate.Guard(hitl_mode="always",
                           on_hitl=lambda v: tollgate.Decision("reject", operator="bob", note="ask the user first"))
    hooks_of(guard)
    ran = []
    seen = run_crew([{"q": "risky"}], ran)
    assert ran == []
    assert any("hitl_transition:reject" in s and "ask the user first" in s for s in seen)


def test_daemon_mode_an_operators_modify_never_runs_the_original_arguments(hooks_of, daemon):
    """Issue 16 §2: an operator modifies a held call; the tool body sees the edited
    arguments only."""
    import threading

    from conftest import wait_until_held

    client = tollgate.connect(socket=daemon.socket, secret_file=daemon.secret_file, agent_id="held-bot",
                              timeout=30)
    op = tollgate.operator(socket=daemon.socket, secret_file=daemon.operator_secret_file)
    hooks_of(client, hitl_timeout=60)

    def modify_when_held():
        p = wait_until_held(op, client.session_id)
        op.decide(client.session_id, "modify", operator="alice", params={"q": "edited"},
                  call_number=p["call_number"])

    t = threading.Thread(target=modify_when_held)
    t.start()
    ran = []
    run_crew([{"q": "original"}], ran)
    t.join()
    assert ran == ["edited"], ran


def test_daemon_mode_a_rejects_note_reaches_the_agent(hooks_of, daemon):
    import threading

    from conftest import wait_until_held

    client = tollgate.connect(socket=daemon.socket, secret_file=daemon.secret_file, agent_id="held-bot",
                              timeout=30)
    op = tollgate.operator(socket=daemon.socket, secret_file=daemon.operator_secret_file)
    hooks_of(client, hitl_timeout=60)

    def reject_when_held():
        p = wait_until_held(op, client.session_id)
        op.decide(client.session_id, "reject", operator="alice", note="the budget owner said no",
                  call_number=p["call_number"])

    t = threading.Thread(target=reject_when_held)
    t.start()
    ran = []
    seen = run_crew([{"q": "x"}], ran)
    t.join()
    assert ran == []
    assert any("the budget owner said no" in s for s in seen), seen


def test_daemon_mode_policies_refuse_and_hold(hooks_of, policy_daemon):
    """Issue 18 through the hooks: each refused call's body never runs and the agent reads
    the policy's reason; the held payment runs once an operator approves it."""
    import threading

    from conftest import wait_until_held

    client = tollgate.connect(socket=policy_daemon.socket, secret_file=policy_daemon.secret_file,
                              agent_id="crew-policy", timeout=30)
    op = tollgate.operator(socket=policy_daemon.socket, secret_file=policy_daemon.operator_secret_file)
    hooks_of(client, hitl_timeout=60)
    ran = []

    @tool("shell")
    def shell(command: str) -> str:
        """Run a shell command."""
        ran.append(("shell", command))
        return "ok"

    @tool("delete_repo")
    def delete_repo(name: str) -> str:
        """Delete a repository."""
        ran.append(("delete_repo", name))
        return "deleted"

    @tool("crm_lookup")
    def crm_lookup(customer: int) -> str:
        """Look a customer up."""
        ran.append(("crm_lookup", customer))
        return "customer 7"

    @tool("send_email")
    def send_email(to: str, body: str) -> str:
        """Send an e-mail."""
        ran.append(("send_email", to))
        return "sent"

    @tool("pay")
    def pay(amount: float, to: str) -> str:
        """Pay an amount."""
        ran.append(("pay", amount))
        return f"paid {amount}"

    steps = [("shell", {"command": "ls"}), ("shell", {"command": "rm -rf /"}), ("delete_repo", {"name": "prod"}),
             ("crm_lookup", {"customer": 7}),
             ("send_email", {"to": "partner@elsewhere.example", "body": "the customer's data"}),
             ("pay", {"amount": 250.5, "to": "shop"})]

    def approve():
        p = wait_until_held(op, client.session_id)
        assert p["tool"] == "pay" and p["held_reason"] == "policy_hold"
        op.decide(client.session_id, "approve", operator="alice", call_number=p["call_number"])

    t = threading.Thread(target=approve)
    t.start()
    llm = ScriptedLLM(model="scripted", script=list(steps), seen=[])
    agent = Agent(role="operator", goal="work", backstory="", llm=llm,
                  tools=[shell, delete_repo, crm_lookup, send_email, pay], max_iter=len(steps) + 2, verbose=False)
    Crew(agents=[agent], tasks=[Task(description="do the work", expected_output="anything", agent=agent)],
         verbose=False).kickoff()
    t.join()
    assert ran == [("shell", "ls"), ("crm_lookup", 7), ("pay", 250.5)], ran
    seen = "\n".join(llm.seen)
    for reason in ("policy:shell-commands", "policy_default_deny", "policy:mail-out-after-customer-data"):
        assert reason in seen, reason
    assert "paid 250.5" in seen
    assert not client.session_state()["circuit_tripped"]
