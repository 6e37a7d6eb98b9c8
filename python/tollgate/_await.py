"""Awaiting a native call (`tollgate._native.Pending`): the work runs on the native module's
own threads, which never touch the interpreter; the result is built here, on the event
loop's thread. (A native thread that completed an asyncio future itself could still be
holding the interpreter when a program's last await returned and the interpreter began
to shut down: a fatal error at exit.)"""

from __future__ import annotations

import asyncio
from typing import Any


async def wait(pending: Any) -> Any:
    """Wait, without blocking the loop, until `pending` is done; return its result."""
    loop = asyncio.get_running_loop()
    fd = pending.fileno()
    ready = loop.create_future()

    def on_ready() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, on_ready)
    try:
        await ready
    except BaseException:
        pending.cancel()
        raise
    finally:
        loop.remove_reader(fd)
    return pending.result()
