"""Daemon mode over gRPC with mutual TLS, against a real `tollgate serve` whose test PKI
`tollgate certs` made: the same `Client` as on the socket (verdicts, settlement, held
calls released by an operator, who stays on the socket), and the same fail-closed
contract: a client without a good certificate, or that does not trust the daemon's, is
refused and nothing is decided for it."""

from __future__ import annotations

import asyncio
import socket as socketlib
import threading

import pytest

import tollgate
from conftest import Daemon, make_pki, wait_until_held

CONFIG = """
    [guard.default]
    budget_usd = 1.0
    max_repeat_calls = 3

    [guard.agents.held-bot]
    hitl_mode = "always"

    [limits]
    await_decision_max_secs = 60
    # Every test registers over gRPC from 127.0.0.1.
    registrations_per_second_per_peer = 1000
"""


@pytest.fixture(scope="module")
def daemon():
    # The daemon's certificate names 127.0.0.1 only, so that a client checking another
    # name fails (and the default name, the host of the address, is seen to work).
    d = Daemon(CONFIG, grpc=True)
    yield d
    d.stop()


@pytest.fixture(scope="module")
def stranger(tmp_path_factory):
    """Another PKI: a CA the daemon does not trust, and a `default/agent` client
    certificate it issued."""
    out = tmp_path_factory.mktemp("stranger") / "pki"
    make_pki(out, ["default/agent"])
    return out


def connect(d, agent="grpc-bot", **kw):
    """Connect as `agent` of `default` with the certificate that names it (a certificate
    registers as the agent it names only)."""
    kw.setdefault("timeout", 30.0)
    own = (d.pki / f"client-default-{agent}.pem", d.pki / f"client-default-{agent}.key")
    for k, v in (("ca", d.ca), ("cert", own[0]), ("key", own[1])):
        kw.setdefault(k, v)
    return tollgate.connect(grpc=d.grpc_addr, agent_id=agent, **kw)


def operator(d):
    return tollgate.operator(socket=d.socket, secret_file=d.operator_secret_file)


def test_a_check_is_allowed_over_grpc(daemon):
    c = connect(daemon, "grpc-bot", server_name="127.0.0.1", organization_id="default")
    assert isinstance(c, tollgate.Client) and c.budget_usd == 1.0
    got = []
    for _ in range(4):
        v = c.check("web_search", {"q": "rust"}, 0.002)
        got.append((v.verdict, v.reason))
        assert v.audit_entry_id and v.error is None
        if v.allowed:
            assert c.settle(v, 0.0015)
    assert got == [("ALLOW", "within_thresholds")] * 3 + [("DENY", "max_repeat_exceeded")]
    state = c.session_state()
    assert state["last_call_number"] == 4 and state["circuit_tripped"]
    assert c.heartbeat() == pytest.approx(0.994)
    c.close()
    # Decided and audited by the daemon (a settlement over gRPC is answered once durable).
    assert daemon.audited("grpc-bot") == ["session_opened"] + ["verdict", "settlement"] * 3 + ["verdict"]


def test_the_organization_is_the_certificates_unless_given(daemon):
    pki = daemon.pki
    acme = {"cert": pki / "client-acme-bot.pem", "key": pki / "client-acme-bot.key"}
    c = connect(daemon, "bot", **acme)
    assert c.check("t", {}).allowed
    assert daemon.audited("bot", "organization_id") == ["acme", "acme"]
    with pytest.raises(tollgate.ConnectError) as e:
        connect(daemon, "bot", organization="default", **acme)
    assert e.value.args[0] == "fail_closed:authentication_failed"


def test_a_certificate_registers_only_as_the_agent_it_names(daemon):
    # Issue 15 §3: `spiffe://default/grpc-bot` cannot register as someone else (to get
    # another guard, or a fresh per_agent budget).
    for other in ("someone-else", "held-bot", "grpc-bot "):
        with pytest.raises((tollgate.ConnectError, ValueError)) as e:
            connect(daemon, other, cert=daemon.pki / "client-default-grpc-bot.pem",
                    key=daemon.pki / "client-default-grpc-bot.key")
        if e.type is tollgate.ConnectError:
            assert e.value.args[0] == "fail_closed:authentication_failed", other
    assert daemon.audited("someone-else") == []


def test_an_async_client_over_grpc(daemon):
    async def main():
        c = await tollgate.aconnect(grpc=daemon.grpc_addr, ca=daemon.ca,
                                    cert=daemon.pki / "client-default-async-grpc.pem",
                                    key=daemon.pki / "client-default-async-grpc.key",
                                    agent_id="async-grpc", timeout=30.0)
        v = await c.acheck("t", {"a": 1}, 0.01)
        return v, await c.asettle(v, 0.01)

    v, settled = asyncio.run(main())
    assert v.reason == "within_thresholds" and settled


def test_a_held_call_is_released_by_an_operator_on_the_socket(daemon):
    c = connect(daemon, "held-bot")
    op = operator(daemon)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", c.check_or_wait("pay", {"to": "acct"}, timeout=60)))
    t.start()
    # The params reached the operator: the agent sent them over gRPC and now waits there.
    pending = wait_until_held(op, c.session_id)
    assert pending["tool"] == "pay" and pending["params"] == {"to": "acct"}
    assert pending["agent_id"] == "held-bot" and pending["held_reason"] == "hitl_all_calls"
    op.decide(c.session_id, "approve", operator="alice", note="ok")
    t.join()
    r = out["r"]
    assert r.allowed and r.decision == "approve" and r.params == {"to": "acct"}
    assert r.verdict.reason == "hitl_transition:approve"


def test_a_modify_while_the_agent_awaits_over_grpc_runs_the_edited_call(daemon):
    c = connect(daemon, "held-bot")
    op = operator(daemon)

    async def main():
        async def human():
            await asyncio.to_thread(wait_until_held, op, c.session_id)
            op.decide(c.session_id, "modify", operator="alice", params={"amount": 10})

        r, _ = await asyncio.gather(c.acheck_or_wait("pay", {"amount": 1000}, timeout=60), human())
        return r

    r = asyncio.run(main())
    assert r.allowed and r.decision == "modify" and r.params == {"amount": 10}
    assert r.verdict.reason == "hitl_transition:modify_successor"


def test_await_decision_over_grpc(daemon):
    c = connect(daemon, "held-bot")
    op = operator(daemon)
    held = c.check("login", {"user": "root"})
    assert held.held and held.reason == "hitl_all_calls"
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("d", c.await_decision(held.call_number, timeout=60)))
    t.start()
    pending = wait_until_held(op, c.session_id, with_params=False)
    assert pending["call_number"] == held.call_number and pending["params"] is None
    op.decide(c.session_id, "reject", operator="alice", note="not from this host")
    t.join()
    # The human's note comes with the decision (issue 16 §5), over gRPC too.
    assert out["d"] == {"outcome": "reject", "successor_params": None, "note": "not from this host"}


def refused(**kw):
    with pytest.raises(tollgate.ConnectError) as e:
        kw.setdefault("timeout", 30.0)
        tollgate.Client(**kw)
    return e.value.args[0]


def test_without_a_good_certificate_or_the_right_ca_nothing_is_decided(daemon, stranger):
    agent = "refused-bot"
    ca = daemon.ca.read_bytes()
    # No client certificate. With TLS 1.3 the client finishes its handshake before the
    # daemon refuses, so it reads either the daemon's alert or a closed connection.
    assert refused(grpc=daemon.grpc_addr, ca_pem=ca, agent_id=agent) in (
        "fail_closed:tls", "fail_closed:daemon_unreachable")
    # A client certificate of a CA the daemon does not trust.
    assert refused(grpc=daemon.grpc_addr, ca_pem=ca, agent_id=agent,
                   cert_pem=(stranger / "client-default-agent.pem").read_bytes(),
                   key_pem=(stranger / "client-default-agent.key").read_bytes()) in (
        "fail_closed:tls", "fail_closed:daemon_unreachable")
    # The client trusts another CA than the one that issued the daemon's certificate.
    with pytest.raises(tollgate.ConnectError) as e:
        connect(daemon, agent, ca=stranger / "ca.pem")
    assert e.value.args[0] == "fail_closed:tls"
    # The daemon's certificate does not name `localhost` (only 127.0.0.1).
    with pytest.raises(tollgate.ConnectError) as e:
        connect(daemon, agent, server_name="localhost")
    assert e.value.args[0] == "fail_closed:tls" and "not valid for name" in e.value.args[1]
    # Files that are not PEM.
    with pytest.raises(tollgate.ConnectError) as e:
        connect(daemon, agent, key=daemon.ca)
    assert e.value.args[0] == "fail_closed:tls"
    assert daemon.audited(agent) == []
    # The same agent with its certificate: decided, and seen in the log.
    assert connect(daemon, agent).check("t", {}).allowed
    assert daemon.audited(agent) == ["session_opened", "verdict"]


def test_a_silent_daemon_over_grpc_is_a_deny_fail_closed(daemon):
    c = connect(daemon, "slow-grpc", timeout=2.0, heartbeat_interval=0)
    ran = []

    @c.tool
    def buy(item):
        ran.append(item)

    daemon.pause()
    try:
        v = c.check("t", {"a": 1})
        with pytest.raises(tollgate.ToolDenied) as e:
            buy("x")
    finally:
        daemon.resume()
    assert (v.verdict, v.reason) == ("DENY", "fail_closed:timeout")
    assert v.budget_remaining_usd is None and "did not answer" in v.error
    assert e.value.reason == "fail_closed:timeout" and ran == []


def test_operators_stay_on_the_socket(daemon):
    with pytest.raises(ValueError, match="operators are not served over grpc"):
        tollgate.operator(grpc=daemon.grpc_addr, ca=daemon.ca, cert=daemon.cert, key=daemon.key)
    with pytest.raises(ValueError, match="operators are not served over grpc"):
        tollgate.operator(socket=daemon.socket, secret_file=daemon.operator_secret_file, grpc=daemon.grpc_addr)
    with pytest.raises(ValueError, match="needs socket"):
        tollgate.operator(secret_file=daemon.operator_secret_file)
    assert operator(daemon).pending() is not None


def test_bad_arguments_are_value_errors(daemon, tmp_path):
    g = {"grpc": daemon.grpc_addr, "agent_id": "x"}
    tls = {"ca": daemon.ca, "cert": daemon.cert, "key": daemon.key}
    cases = [
        (dict(socket=daemon.socket, secret_file=daemon.secret_file, **g, **tls), "exactly one of socket and grpc"),
        (dict(agent_id="x"), "exactly one of socket and grpc"),
        (dict(**g, ca=daemon.ca, cert=daemon.cert), "grpc needs ca"),
        (dict(**g, cert=daemon.cert, key=daemon.key), "grpc needs ca"),
        (dict(**g, **tls, secret_file=daemon.secret_file), "not used over grpc"),
        (dict(socket=daemon.socket, secret_file=daemon.secret_file, agent_id="x", ca=daemon.ca), "for grpc"),
        (dict(**g, **tls, organization="default", organization_id="default"), "one of organization"),
    ]
    for kw, msg in cases:
        with pytest.raises(ValueError, match=msg):
            tollgate.connect(**kw)
    big = tmp_path / "big.pem"
    big.write_bytes(b"x" * ((1 << 20) + 1))
    with pytest.raises(ValueError, match="larger than"):
        tollgate.connect(**g, ca=big, cert=daemon.cert, key=daemon.key)
    with pytest.raises(FileNotFoundError):
        tollgate.connect(**g, ca=tmp_path / "missing.pem", cert=daemon.cert, key=daemon.key)
    # The native constructor checks the same.
    ca = daemon.ca.read_bytes()
    native = [
        (dict(socket=daemon.socket, secret=b"s", **g, ca_pem=ca), "exactly one of `socket` and `grpc`"),
        (dict(**g), "needs `ca_pem`"),
        (dict(**g, ca_pem=ca, cert_pem=ca), "both `cert_pem` and `key_pem`"),
        (dict(**g, ca_pem=ca, secret=b"s"), "`secret` is not used"),
        (dict(socket=daemon.socket, secret=b"s", agent_id="x", ca_pem=ca), "are for `grpc`"),
        (dict(socket=daemon.socket, agent_id="x"), "`socket` needs `secret`"),
    ]
    for kw, msg in native:
        with pytest.raises(ValueError, match=msg):
            tollgate.Client(**kw)


def ipv6_loopback() -> bool:
    try:
        with socketlib.socket(socketlib.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_the_default_server_name_is_the_host_of_the_address_ipv6_too():
    d = Daemon(CONFIG, grpc=True, server_names=("::1",), listen="[::1]:0")
    try:
        assert d.grpc_addr.startswith("[::1]:")
        c = connect(d, "v6-bot")  # checks the certificate against `::1`
        assert c.check("t", {}).allowed
    finally:
        d.stop()
