"""Issue 15 §3: an agent enrolled with its own secret connects with it (and only it), ids
follow the daemon's one rule, in library mode too."""

from __future__ import annotations

import pytest

import tollgate
from conftest import Daemon

AGENT_SECRET = "py-bot's very own secret"

ENROLLED = f"""
    [[organization]]
    id = "default"
    require_enrollment = true

    [[organization.agent]]
    id = "py-bot"
    secret = "{AGENT_SECRET}"

    [guard.agents.py-bot]
    budget_usd = 0.5
"""


@pytest.fixture(scope="module")
def enrolled():
    d = Daemon(ENROLLED)
    yield d
    d.stop()


def test_an_enrolled_agent_connects_with_its_own_secret(enrolled):
    c = tollgate.connect(socket=enrolled.socket, secret=AGENT_SECRET, agent_id="py-bot", timeout=30.0)
    assert c.budget_usd == 0.5
    assert c.check("web_search", {"q": "rust"}, 0.1).allowed


def test_the_organizations_secret_cannot_act_as_it_nor_mint_new_ids(enrolled):
    for agent in ("py-bot", "py-bot-0", "py-bot-1"):
        with pytest.raises(tollgate.ConnectError) as e:
            tollgate.connect(socket=enrolled.socket, secret_file=enrolled.secret_file, agent_id=agent)
        assert e.value.args[0] == "fail_closed:authentication_failed", agent
    # Its own secret is no other agent's either.
    with pytest.raises(tollgate.ConnectError) as e:
        tollgate.connect(socket=enrolled.socket, secret=AGENT_SECRET, agent_id="someone-else")
    assert e.value.args[0] == "fail_closed:authentication_failed"


@pytest.mark.parametrize("bad", ["py-bot ", "py\u00a0bot", "py-bot\u2028", "py\u3000bot", "a\x01", ""])
def test_bad_ids_are_refused_in_both_modes(enrolled, bad):
    with pytest.raises(ValueError, match="agent_id"):
        tollgate.connect(socket=enrolled.socket, secret=AGENT_SECRET, agent_id=bad)
    with pytest.raises(ValueError, match="agent_id"):
        tollgate.Guard(agent_id=bad)
