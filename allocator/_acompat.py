"""What the asyncio allocator and the blocking one do differently.

The asyncio modules (`allocator/_async.py`, `allocator/_async_admin.py`)
are the one source of both: the blocking ones are generated from them by
docs/scripts/async_to_sync.py, which drops ``await`` and ``async``, and
renames each asyncio name of this module (``aname``, ``AName``) to its
blocking twin (``name``, ``Name``). What cannot be said by that rewrite is
said here, once for each side, and nowhere else.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from ._transport import client_kind

__all__ = ["APause", "AWorker", "Pause", "Worker", "acheck_client", "check_client"]

#: ``pause(seconds)``: True once ``seconds`` passed, False (at once) once
#: the worker is stopped; an asyncio worker is cancelled instead.
Pause = Callable[[float], bool]
APause = Callable[[float], Awaitable[bool]]

# For each kind of client: what it is called, what the other kind is
# called, and the allocator that takes the other kind.
_KINDS = {
    "sync": ("a blocking", "the asyncio", "AsyncFairAllocator"),
    "async": ("an asyncio", "the blocking", "FairAllocator"),
}


def _check_client(allocator: object, client: object, kind: str) -> None:
    if client_kind(client) == kind:
        return
    wanted, other, use = _KINDS[kind]
    raise TypeError(
        f"client must be {wanted} Redis client for {type(allocator).__name__}, "
        f"got {other} {type(client).__module__}.{type(client).__qualname__}: "
        f"use {use} with it"
    )


def check_client(allocator: object, client: object) -> None:
    """Raise ``TypeError`` unless ``client`` is a blocking client (it runs
    the calls of ``allocator``), saying which allocator takes it."""
    _check_client(allocator, client, "sync")


def acheck_client(allocator: object, client: object) -> None:
    """Raise ``TypeError`` unless ``client`` is an asyncio client."""
    _check_client(allocator, client, "async")


class Worker:
    """Runs ``run(pause)`` in a daemon thread named ``name`` until ``run``
    returns or :meth:`stop` is called: ``pause`` then returns False at once."""

    def __init__(self, run: Callable[[Pause], None], name: str) -> None:
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=run, args=(self._pause,), name=name, daemon=True)
        self._thread.start()

    def _pause(self, seconds: float) -> bool:
        return not self._stopped.wait(seconds)

    def stop(self) -> None:
        """Stop the worker and wait for its thread to end (a call of ``run``
        under way finishes first)."""
        self._stopped.set()
        self._thread.join()


class AWorker:
    """Runs ``run(pause)`` as a task of the running event loop until ``run``
    returns or :meth:`stop` cancels it."""

    def __init__(self, run: Callable[[APause], Coroutine[Any, Any, None]], name: str) -> None:
        self._task = asyncio.get_running_loop().create_task(run(self._pause), name=name)

    @staticmethod
    async def _pause(seconds: float) -> bool:
        await asyncio.sleep(seconds)
        return True

    async def stop(self) -> None:
        """Cancel the task and wait for it to end."""
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            # The worker's own cancellation ends here; one aimed at the
            # caller (who is awaiting this) goes on.
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
