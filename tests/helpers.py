"""Small tools shared by the tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from allocator import FairAllocator
from allocator._core import RECHECK, Call, Sleep, Wait


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    """Wait for a condition on shared state (not for time to pass)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.005)


def ticket_key(ticket: str) -> tuple[int, int]:
    ms, seq = ticket.split("-")
    return int(ms), int(seq)


class Background:
    """Run a call in a thread; keep its result or exception."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:
            self.error = exc

    def join(self, timeout: float = 20.0) -> Any:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "background call did not finish"
        if self.error is not None:
            raise self.error
        return self.result

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()


class Stepper:
    """Drives an acquire flow of a sync FairAllocator one step at a time, so a
    test can put other events between any two steps. It is registered with
    the allocator's reader like a real acquire."""

    def __init__(self, pool: FairAllocator, **kwargs: Any) -> None:
        self.pool = pool
        self.flow = pool._pool.acquire(
            kwargs.get("timeout"),
            kwargs.get("ttl"),
            kwargs.get("bind"),
            kwargs.get("blocking", True),
        )
        pool._get_router().register(self.flow.lid)
        self.steps: list[Any] = []
        self.step: Any = self.flow.steps.send(None)
        self.done = False
        self.value: Any = None

    def _advance(self, send: Any = None, throw: BaseException | None = None) -> Any:
        try:
            self.step = self.flow.steps.throw(throw) if throw else self.flow.steps.send(send)
        except StopIteration as stop:
            self.done, self.value, self.step = True, stop.value, None
        return self.step

    def run_step(self) -> Any:
        """Carry out the current step for real and move to the next."""
        step = self.step
        self.steps.append(step)
        if isinstance(step, (Call, Wait)):
            return self._advance(self.pool._step(step))
        assert isinstance(step, Sleep)
        return self._advance(None)

    def nudge(self) -> None:
        """Have the reader ask this waiter to look again (as after a data loss)."""
        self.pool._get_router()._queues[self.flow.lid].put(RECHECK)

    def throw(self, exc: BaseException) -> Any:
        """Deliver an exception at the current step (as a timeout or a
        KeyboardInterrupt would), and return the step the flow asks for."""
        return self._advance(throw=exc)
