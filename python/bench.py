#!/usr/bin/env python3
"""Overhead of a guarded call from Python, next to the same call without Tollgate.

    python python/bench.py                          # library mode only
    python python/bench.py --spawn target/release/tollgate   # + daemon mode, own serve
    python python/bench.py --socket S --secret-file F         # + daemon mode, running serve

Library mode: `Guard.check` on a typical ALLOW (small params, hashed and classified each
call), `@guard.tool` around a plain function (check + run + settle) against the bare
function. Daemon mode: `Client.check` round trips (p50/p99) and the decorated function.
With LangChain installed: a LangGraph `ToolNode` call with and without the middleware.
Numbers are per call; the machine's load matters (see README, Python).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import tollgate

PARAMS = {"q": "rust borrow checker", "limit": 5, "lang": "en"}


def mean_ns(fn, n):
    for _ in range(min(n // 10, 10_000)):  # warm-up
        fn()
    t = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t) / n


def percentiles_us(fn, n):
    samples = []
    for _ in range(min(n // 10, 200)):
        fn()
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t)
    samples.sort()
    q = statistics.quantiles(samples, n=100)
    return q[49] / 1e3, q[98] / 1e3


def row(name, value):
    print(f"{name:<58} {value}")


def library(n):
    print("library mode (in process)")
    g = tollgate.Guard(budget_usd=1e9, max_repeat_calls=0)
    row("Guard.check, typical ALLOW, 3-key params", f"{mean_ns(lambda: g.check('web_search', PARAMS, 0.002), n):,.0f} ns")
    v = g.check("web_search", PARAMS, 0.002)
    assert v.reason == "within_thresholds", v
    row("Guard.settle", f"{mean_ns(lambda: g.settle(v.call_number, 0.001), n):,.0f} ns")

    def search(q, limit=5, lang="en"):
        return q

    guarded = g.tool(search)
    bare = mean_ns(lambda: search("rust borrow checker", 5, "en"), n)
    wrapped = mean_ns(lambda: guarded("rust borrow checker", 5, "en"), n)
    row("plain function call", f"{bare:,.0f} ns")
    row("@guard.tool function call (check + run + settle)", f"{wrapped:,.0f} ns (+{wrapped - bare:,.0f} ns)")
    row("canonical_hash of the params", f"{mean_ns(lambda: tollgate.canonical_hash(PARAMS), n):,.0f} ns")


def daemon(socket, secret_file, n):
    print(f"daemon mode ({socket})")
    c = tollgate.connect(socket=socket, secret_file=secret_file, agent_id="py-bench", heartbeat_interval=0)
    i = [0]

    def check():
        i[0] += 1
        v = c.check("web_search", {"q": "rust", "i": i[0]}, 0.0)
        if not v.allowed:
            raise SystemExit(f"not allowed: {v.reason} (raise the daemon's rate limit and budget)")

    p50, p99 = percentiles_us(check, n)
    row("Client.check round trip", f"p50 {p50:,.0f} us, p99 {p99:,.0f} us")

    def search(q, i):
        return q

    guarded = c.tool(search)

    def call():
        i[0] += 1
        guarded("rust", i[0])

    bare50, bare99 = percentiles_us(lambda: search("rust", 1), n)
    p50, p99 = percentiles_us(call, n)
    row("plain function call", f"p50 {bare50:,.2f} us, p99 {bare99:,.2f} us")
    row("@client.tool function call (check_or_wait + run + settle)", f"p50 {p50:,.0f} us, p99 {p99:,.0f} us")
    return c


def langchain(n, client):
    try:
        from langchain_core.messages import AIMessage
        from langchain_core.tools import tool
        from langgraph.graph import START, MessagesState, StateGraph
        from langgraph.prebuilt import ToolNode
    except ImportError:
        return
    from tollgate.integrations.langchain import TollgateMiddleware

    print("LangGraph ToolNode, one tool call per invoke")

    @tool
    def search(q: str) -> str:
        """Search."""
        return q

    def app(**wrappers):
        graph = StateGraph(MessagesState)
        graph.add_node("tools", ToolNode([search], **wrappers))
        graph.add_edge(START, "tools")
        return graph.compile()

    i = [0]

    def invoke(a):
        def go():
            i[0] += 1
            msg = AIMessage(content="", tool_calls=[{"name": "search", "args": {"q": f"x{i[0]}"}, "id": "1"}])
            out = a.invoke({"messages": [msg]})
            assert "blocked" not in out["messages"][-1].content, out["messages"][-1].content
        return go

    m = max(n // 100, 200)
    plain = percentiles_us(invoke(app()), m)
    row("without Tollgate", f"p50 {plain[0]:,.0f} us, p99 {plain[1]:,.0f} us")
    mw = TollgateMiddleware(tollgate.Guard(budget_usd=1e9, max_repeat_calls=0))
    lib = percentiles_us(invoke(app(wrap_tool_call=mw.wrap_tool_call)), m)
    row("with TollgateMiddleware(Guard)", f"p50 {lib[0]:,.0f} us, p99 {lib[1]:,.0f} us")
    if client is not None:
        mw = TollgateMiddleware(client)
        d = percentiles_us(invoke(app(wrap_tool_call=mw.wrap_tool_call)), m)
        row("with TollgateMiddleware(Client), daemon mode", f"p50 {d[0]:,.0f} us, p99 {d[1]:,.0f} us")


def spawn(binary):
    d = pathlib.Path(tempfile.mkdtemp(prefix="tgb-"))
    (d / "t.toml").write_text(
        "[limits]\npre_exec_per_second_per_session = 1000000\n[guard.default]\nbudget_usd = 1000000.0\n")
    proc = subprocess.Popen([binary, "serve", "--config", str(d / "t.toml"), "--data-dir", str(d / "data"),
                             "--socket", str(d / "s.sock")], stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if "listening on" in line:
            break
    return proc, d / "s.sock", d / "data" / "secrets" / "default.secret"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=200_000, help="calls per library-mode measurement")
    ap.add_argument("--daemon-calls", type=int, default=5_000)
    ap.add_argument("--spawn", metavar="TOLLGATE_BIN", help="start `tollgate serve` (its own process) for daemon mode")
    ap.add_argument("--socket")
    ap.add_argument("--secret-file")
    a = ap.parse_args()
    print(f"python {sys.version.split()[0]}, tollgate {tollgate.__version__}, load average {os.getloadavg()[0]:.2f}")
    library(a.n)
    proc = None
    client = None
    if a.spawn:
        proc, a.socket, a.secret_file = spawn(a.spawn)
    try:
        if a.socket:
            client = daemon(a.socket, a.secret_file, a.daemon_calls)
        langchain(a.n, client)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
