"""A pure harness for the core's flows: no Redis, no threads, no real time.

The core (``allocator/_core/``) decides everything and does no I/O: a pool
operation is a generator of steps (``Call``: run this script; ``Wait``:
wait for a message; ``Sleep``: back off; ``Defer``/``Settle``/``Pending``:
the ends still to deliver), and so are a reader's rounds (``Beat``,
``Exchange``, ``Deliver``, ``Sleep``, ``Subscribe``), carried out by whichever
waiter leads them (the core's ``Lead``). The shells (``_sync_io``,
``_async_io``) carry each step out and send its result back, or throw its
error in. Here the test is the shell: it answers each step with a canned
reply (a grant, a timeout, a transport error, a ``ResponseError``, an
exception raised into the caller), in the order of events it wants, on a
fake clock, and looks at the steps the core asked for.

- :class:`Clock`: the monotonic clock (and the jitter) the core reads, in
  the test's thread only;
- :class:`Run`: one flow driven step by step (:func:`acquiring` makes an
  acquire's), the steps it yielded recorded; the ends it hands over are
  kept by the core's own ``Ends`` (:attr:`Run.ends`);
- :class:`Reading`: a client's reader, its core and its lead, carried out
  by hand;
- the replies and messages of the scripts (:func:`queued`,
  :func:`granted`, :func:`grant_message`, :func:`alive`...), in the shapes
  lua/*.lua give them, and the errors a step may raise.

Every name of the core the tests use is imported here, once: a test
imports it from this module, so that a module of the core that moves is
one line to change.
"""

from __future__ import annotations

import importlib
import pkgutil
import queue
import random
import sys
import threading
import time
from collections.abc import Generator
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

import allocator._core
from allocator import Lease
from allocator._core.keys import PICK
from allocator._core.lead import LEAD, THREAD, Lead, block_for, step_error, take_item
from allocator._core.liveness import ALIVE, HEARTBEAT
from allocator._core.messages import RECHECK
from allocator._core.pending import RIDE_OUT, Ends, end_key
from allocator._core.pool import Pool
from allocator._core.reader import DUE_SLACK, Reader
from allocator._core.retry import MIN_TRY, SIDE_BUDGET
from allocator._core.steps import (
    Beat,
    Call,
    Defer,
    Deliver,
    Exchange,
    Pending,
    ReaderStep,
    Settle,
    Sleep,
    Subscribe,
    Wait,
)

__all__ = [
    "ALIVE",
    "DUE_SLACK",
    "HEARTBEAT",
    "LEAD",
    "MIN_TRY",
    "PICK",
    "RECHECK",
    "RIDE_OUT",
    "SIDE_BUDGET",
    "THREAD",
    "Beat",
    "Call",
    "Clock",
    "Defer",
    "Deliver",
    "Ends",
    "Exchange",
    "Lead",
    "Pending",
    "Pool",
    "Reader",
    "Reading",
    "Run",
    "Settle",
    "Sleep",
    "Subscribe",
    "Wait",
    "acquiring",
    "alive",
    "block_for",
    "end_key",
    "grant_message",
    "granted",
    "hint_message",
    "lease_of",
    "make_pool",
    "queued",
    "refusal",
    "step_error",
    "tag",
    "take_item",
    "transport",
]


# -- the clock ---------------------------------------------------------------------


class Clock:
    """The core's ``time.monotonic()``, and its jitter (``random.uniform``),
    in the thread that made the clock: a fake that moves only when the
    test says so (:meth:`advance`), or when a :class:`Run` or a
    :class:`Reading` carries out a pause. Other threads (a reader left
    from an earlier test) keep the real ones."""

    def __init__(self, start: float = 1000.0, seed: int = 0) -> None:
        self.now = start
        self.rng = random.Random(seed)
        self._owner = threading.get_ident()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        assert seconds >= 0, "a monotonic clock never goes back"
        self.now += seconds
        return self.now

    @property
    def mine(self) -> bool:
        """Whether the calling thread is the test's."""
        return threading.get_ident() == self._owner

    def install(self, monkeypatch: pytest.MonkeyPatch) -> Clock:
        """Put this clock in every module of the core (for the test's
        length: ``monkeypatch`` undoes it). Each module of the core that
        imports ``time`` or ``random`` sees this clock's instead."""
        for info in pkgutil.iter_modules(allocator._core.__path__):
            importlib.import_module(f"allocator._core.{info.name}")
        for name, module in list(sys.modules.items()):
            if not name.startswith("allocator._core."):
                continue
            if getattr(module, "time", None) is time:
                monkeypatch.setattr(module, "time", _Time(self))
            if getattr(module, "random", None) is random:
                monkeypatch.setattr(module, "random", _Random(self, random))
            jitter = getattr(module, "_jitter", None)
            if isinstance(jitter, random.Random):
                monkeypatch.setattr(module, "_jitter", _Random(self, jitter))
            for clock in ("monotonic", "uniform"):
                # A clock taken by name would not be this one: say so.
                assert getattr(module, clock, None) not in (time.monotonic, random.uniform), (
                    f"{name} imports {clock} by name: import the module, or fake it here too"
                )
        return self


class _Time:
    """The ``time`` module as the core sees it under a :class:`Clock`."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def monotonic(self) -> float:
        return self._clock.now if self._clock.mine else time.monotonic()

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


class _Random:
    """The ``random`` module as the core sees it under a :class:`Clock`:
    seeded, so that every backoff is the same in every run."""

    def __init__(self, clock: Clock, real: Any) -> None:
        self._clock = clock
        self._real = real  # the module, or the core's own generator

    def uniform(self, a: float, b: float) -> float:
        return self._clock.rng.uniform(a, b) if self._clock.mine else self._real.uniform(a, b)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


# -- the replies of the scripts, the messages of the lists, the errors -----------


def make_pool(name: str = "p", **settings: Any) -> Pool:
    """A pool's core (no client: nothing is sent)."""
    options: dict[str, Any] = {"lease_ttl": 60, "bind_ttl": 3600, "prefix": "alloc"}
    options.update(settings)
    return Pool.create(name, **options)


def queued(ticket: str = "1-1", hint_ms: int = -1) -> list[Any]:
    """acquire.lua, poll.lua: still queued (``hint_ms``: look again then, -1: no hint)."""
    return ["queued", ticket, hint_ms]


def granted(
    ticket: str = "1-1",
    token: int = 7,
    resource: str = "r",
    ttl_ms: int = 60_000,
    granted_us: int = 1_700_000_000_000_000,
) -> list[Any]:
    """acquire.lua, poll.lua: granted in the reply."""
    deadline_ms = granted_us // 1000 + ttl_ms
    return ["granted", ticket, token, granted_us, deadline_ms, ttl_ms, resource]


def grant_message(
    lid: str,
    ticket: str = "1-1",
    token: int = 7,
    resource: str = "r",
    ttl_ms: int = 60_000,
    granted_us: int = 1_700_000_000_000_000,
) -> str:
    """A grant pushed to its waiter's client's list (lua/README.md)."""
    return f"g|{lid}|{ticket}|{token}|{granted_us}|{ttl_ms}|{resource}"


def hint_message(lid: str, ms: int) -> str:
    """A hint pushed to a waiter: look again in ``ms``."""
    return f"h|{lid}|{ms}"


def alive(
    epoch: str = "e1",
    probe_ok: bool = True,
    more: bool = False,
    present: int = -1,
    due_ms: int = -1,
) -> list[Any]:
    """poll.lua's reply to a reader's heartbeat."""
    return ["alive", epoch, int(probe_ok), int(more), present, due_ms]


def tag(word: str) -> list[str]:
    """A reply of one word: cancel.lua's ``cancelled``/``released``/``gone``,
    release.lua's ``released``/``lost``/``claimed``."""
    return [word]


def lease_of(pool: Pool, lid: str = "l1", ttl_ms: int = 60_000) -> Lease:
    """A lease of ``pool``, as the reply of the acquire that granted it makes it."""
    state = pool._state("acquire", lid, granted(ttl_ms=ttl_ms))
    assert isinstance(state, Lease)
    return state


def transport(text: str = "Connection refused") -> RedisConnectionError:
    """A transport error: the reply did not come (it may have been sent)."""
    return RedisConnectionError(text)


def refusal(text: str = "ERR refused") -> ResponseError:
    """The server's error reply: it came, and says no."""
    return ResponseError(text)


# -- a flow, step by step --------------------------------------------------------


class Run:
    """One flow of the core driven by the test, as a shell drives it: each
    answer (:meth:`reply`) or error (:meth:`throw`) goes to the current
    step, and the flow's next step is returned (None once it returned:
    :attr:`done`, :attr:`value`; an exception it raises comes out of the
    call). Every step it yielded is in :attr:`steps`.

    The steps no server answers are carried out as the shells do, by the
    core's own parts: a ``Sleep`` moves the clock (:meth:`settle`), and
    ``Defer``, ``Settle`` and ``Pending`` go to :attr:`ends`, the client's
    ends still to deliver."""

    def __init__(
        self,
        steps: Generator[Any, Any, Any],
        clock: Clock | None = None,
        ends: Ends | None = None,
        lid: str = "",
    ) -> None:
        self.generator = steps
        self.clock = clock
        self.ends = Ends() if ends is None else ends
        self.lid = lid
        self.steps: list[Any] = []
        self.step: Any = None
        self.done = False
        self.value: Any = None
        self._advance()

    def _advance(self, send: Any = None, throw: BaseException | None = None) -> Any:
        try:
            step = self.generator.throw(throw) if throw is not None else self.generator.send(send)
        except StopIteration as stop:
            self.done, self.value, self.step = True, stop.value, None
            self.ended()
            return None
        except BaseException:
            # The flow raised: it is over, as the shell's call would be.
            self.done, self.step = True, None
            self.ended()
            raise
        self.step = step
        self.steps.append(step)
        return step

    def ended(self) -> None:
        """The flow returned or raised (a shell's hook)."""

    def reply(self, value: Any = None) -> Any:
        """The current step's result."""
        assert not self.done, "the flow is over"
        return self._advance(value)

    def throw(self, error: BaseException) -> Any:
        """The current step raised ``error``: a transport error, an error
        reply, or an exception raised into the caller meanwhile (a
        KeyboardInterrupt, a task's cancellation)."""
        assert not self.done, "the flow is over"
        return self._advance(throw=error)

    def interrupt(self, error: BaseException) -> Any:
        """``error`` is raised into the caller at the current step (a
        KeyboardInterrupt, a task's cancellation, its own code's
        exception), which the flow must take to leave the queue first: the
        step it asks for then. One that comes straight out fails the test
        here (a KeyboardInterrupt let through would end the whole run)."""
        try:
            return self.throw(error)
        except BaseException as exc:
            if exc is not error:
                raise
            pytest.fail(f"{type(error).__name__} went straight out of the flow at {self.steps[-1]}")

    def settle(self) -> Any:
        """Carry out the steps that no server answers (pauses, the ends
        kept), and return the first one that needs an answer (None: the
        flow returned)."""
        while True:
            step = self.step
            if isinstance(step, Sleep):
                assert self.clock is not None, "a Run that sleeps needs the clock"
                self.clock.advance(step.seconds)
                self._advance(None)
            elif isinstance(step, (Defer, Settle, Pending)):
                self._advance(self.ends.apply(step))
            else:
                return step

    def call(self, script: str) -> Call[Any]:
        """The current step (after :meth:`settle`), which must run ``script``."""
        step = self.settle()
        assert isinstance(step, Call) and step.script == script, f"expected {script}: {step}"
        return step

    def wait(self) -> Wait:
        """The current step (after :meth:`settle`), which must be a Wait."""
        step = self.settle()
        assert isinstance(step, Wait), f"expected a Wait: {step}"
        return step

    def scripts(self) -> list[str]:
        """The scripts the flow asked for, in order (a retry twice)."""
        return [step.script for step in self.steps if isinstance(step, Call)]

    def wait_out(self, trouble: BaseException | None = None) -> Any:
        """The current Wait runs out: its time passes and nothing came (the
        reader's ``trouble``, if it fails, is the reply)."""
        step = self.wait()
        if step.timeout is not None:
            assert self.clock is not None, "a Run that waits needs the clock"
            self.clock.advance(step.timeout)
        return self.reply(trouble)


def acquiring(
    pool: Pool,
    clock: Clock,
    timeout: float | None = 10.0,
    *,
    cid: str = "c1",
    blocking: bool = True,
    count: int | None = None,
    ends: Ends | None = None,
) -> Run:
    """An acquire (``count``: an acquire_many) of client ``cid`` in
    ``pool``, as ``FairAllocator.acquire`` makes it, at its first step
    (the enqueue)."""
    if count is None:
        flow = pool.acquire(timeout, None, None, blocking, cid=cid)
        return Run(flow.steps, clock, ends, flow.lid)
    many = pool.acquire_many(count, timeout, None, blocking, cid=cid)
    return Run(many.steps, clock, ends, many.lid)


# -- a client's reader, by hand ------------------------------------------------------


class Reading:
    """The reader of one client, its decisions made by the core (``Reader``:
    the rounds; ``Lead``: which waiter carries them out) and its steps
    carried out by the test, as a shell's leading waiter does
    (``Reader._lead``): :meth:`next` asks for the step that waiter ``who``
    carries out now, :meth:`answer` and :meth:`fail` send its outcome back,
    :meth:`carry` does both with an answer of its own (nothing popped, every
    heartbeat answered); :meth:`raised` is an exception raised into the
    leader while it carries a step out.

    Each waiter has an inbox (``queue.SimpleQueue``, as the sync shell's);
    a ``Deliver`` puts its items there, and keeps the releases of the
    grants whose waiters left in :attr:`releases`."""

    def __init__(self, clock: Clock, beat: float = HEARTBEAT) -> None:
        self.clock = clock
        self.core = Reader(beat)
        self.lead = Lead(self.core)
        self.inboxes: dict[str, Any] = {}
        self.releases: list[Call[Any]] = []
        #: Every step of the rounds carried out, in order.
        self.steps: list[ReaderStep] = []

    def cid(self, pool: Pool) -> str:
        """The client's id in ``pool``."""
        return self.core.presences.cid_for(pool)

    def key(self, pool: Pool) -> str:
        """The client's signal list in ``pool``."""
        return pool.signal_key(self.cid(pool))

    def join(self, pool: Pool, lid: str) -> Any:
        """Waiter ``lid`` waits in ``pool`` (the shell registers it before
        its acquire's first step); its inbox."""
        inbox = self.inboxes[lid] = queue.SimpleQueue()
        self.core.register(pool, lid, inbox)
        return inbox

    def take(self, lid: str) -> bool:
        """Waiter ``lid`` has nothing in its inbox and waits: whether it
        leads now."""
        return self.lead.take(lid, self.inboxes[lid], self.clock)

    def leave(self, lid: str) -> Any:
        """Waiter ``lid`` stops waiting (its Wait returned): the lead goes
        on as the shell hands it (``LEAD`` in the next leader's inbox);
        whom the lead woke (an inbox, ``THREAD``, or None)."""
        whom = self.lead.leave(lid)
        if whom is not None and whom is not THREAD:
            whom.put(LEAD)
        return whom

    def gone(self, lid: str) -> Any:
        """Waiter ``lid``'s acquire returned: it is known no more."""
        self.core.unregister(lid)
        self.inboxes.pop(lid, None)
        whom = self.lead.kick()
        if whom is not None and whom is not THREAD:
            whom.put(LEAD)
        return whom

    def next(self, who: Any, deadline: float | None = None) -> ReaderStep | None:
        """The step leader ``who`` carries out now (None: it stops)."""
        inbox = None if who is THREAD else self.inboxes[who]
        step = self.lead.next_step(who, inbox, deadline, self.clock())
        if step is not None and (not self.steps or self.steps[-1] is not step):
            self.steps.append(step)
        return step

    def answer(self, reply: Any = None) -> None:
        """The step went through: its result to the rounds."""
        self.lead.done(reply, None)

    def fail(self, who: Any, error: BaseException) -> bool:
        """The step raised ``error`` in leader ``who``: to the rounds if it
        is the step's own (a Redis error), as the shell does; else it goes
        out of that waiter's call (True)."""
        if step_error(who, error):
            self.lead.done(None, error)
            return False
        return True

    def raised(self, who: Any, error: BaseException) -> bool:
        """``error`` was raised into leader ``who`` while it carried out the
        step: handled as :meth:`fail`; if it goes out of the waiter's call,
        the waiter leaves the lead (the step stays for the next leader).
        True if it went out."""
        out = self.fail(who, error)
        if out and who is not THREAD:
            self.leave(who)
        return out

    def carry(
        self,
        who: Any,
        deadline: float | None = None,
        *,
        popped: list[tuple[Any, Any]] | None = None,
        beats: list[Any] | None = None,
    ) -> ReaderStep | None:
        """Take leader ``who``'s next step and carry it out: a ``Beat``
        answered with ``beats`` (raw poll replies, one per pool; default:
        :func:`alive`), an ``Exchange`` with ``popped`` (``(key, message)``
        pairs; none: it blocks its whole time, and the clock moves by it),
        a ``Deliver`` into the inboxes, a ``Sleep`` as much as the leader's
        ``deadline`` allows (the rest left to the next leader), a
        ``Subscribe`` as done. Returns the step (None: the leader stops)."""
        step = self.next(who, deadline)
        if step is None:
            return None
        if isinstance(step, Beat):
            raws = beats if beats is not None else [alive() for _ in step.calls]
            self.answer(
                [(key, call.parse(raw)) for (key, call), raw in zip(step.calls, raws, strict=True)]
            )
        elif isinstance(step, Exchange):
            if not popped:
                self.clock.advance(block_for(step, deadline, self.clock()))
            self.answer(list(popped or []))
        elif isinstance(step, Deliver):
            while step.items:
                inbox, item = step.items.pop(0)
                inbox.put(item)
            self.releases += step.releases
            step.releases.clear()
            self.answer(None)
        elif isinstance(step, Sleep):
            seconds, over = self.lead.pause(step.seconds, deadline, self.clock())
            self.clock.advance(seconds)
            if over:
                self.answer(None)
        else:
            assert isinstance(step, Subscribe), step
            self.answer(None)
        return step

    def until(self, who: Any, kind: type, deadline: float | None = None) -> Any:
        """Carry out leader ``who``'s steps (as :meth:`carry`) until the
        next one is of ``kind``; that step, not carried out yet."""
        for _ in range(100):
            step = self.next(who, deadline)
            if isinstance(step, kind):
                return step
            assert step is not None, f"the leader stopped before a {kind.__name__}"
            self.carry(who, deadline)
        raise AssertionError(f"no {kind.__name__} in 100 steps")

    def item(self, lid: str) -> Any:
        """What waiter ``lid`` finds in its inbox (``LEAD``: nothing)."""
        return take_item(self.inboxes[lid])
