"""Daemon mode: an agent guarded by a separately running `tollgate serve`.

In one terminal:   cargo run --release -p tollgate -- serve
In another:        python examples/python/daemon_client.py \\
                       --socket tollgate-data/tollgate.sock \\
                       --secret-file tollgate-data/secrets/default.secret

The daemon decides, keeps the session's state and signs every verdict into its audit log;
this process only asks. An unreachable or silent daemon is a DENY (`fail_closed:...`).
"""

import argparse
import asyncio

import tollgate

ap = argparse.ArgumentParser()
ap.add_argument("--socket", required=True)
ap.add_argument("--secret-file", required=True)
a = ap.parse_args()

client = tollgate.connect(socket=a.socket, secret_file=a.secret_file, agent_id="example-bot",
                          framework="python-example")
print(f"session {client.session_id}, budget ${client.budget_usd}")


@client.tool(cost=0.002)
def web_search(q: str) -> str:
    return f"results for {q}"


async def main():
    # Awaiting the daemon does not block the event loop.
    v = await client.acheck("web_search", {"q": "async"}, 0.002)
    print(f"async check: {v.verdict} {v.reason}")


asyncio.run(main())

# The embedded default guard allows 3 identical calls in a row; the 4th trips the circuit.
for _ in range(4):
    try:
        print(web_search("sp/1.0"))
    except tollgate.ToolDenied as e:
        print(f"denied: {e.reason}")


print(client.session_state())
