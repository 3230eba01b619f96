"""The steps the shells carry out for the core's flows.

A pool operation (:mod:`.leasing`, :mod:`.admin`) yields :class:`Call`,
:class:`Wait`, :class:`Sleep` and :class:`Command` (and :class:`Defer`,
:class:`Settle`, :class:`Pending` for the ends still to deliver); a reader's loop
(:class:`~.reader.Reader`) yields :class:`Beat`, :class:`Exchange`,
:class:`Deliver` and :class:`Sleep`. The shells carry each one out with
blocking or awaiting I/O and send back its result (or throw its error in).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, Generic, NamedTuple, TypeVar

import attrs

T = TypeVar("T")


@attrs.frozen
class Call(Generic[T]):
    """Run script ``script`` with these keys and args; ``parse`` reads the reply."""

    script: str
    keys: tuple[str, ...]
    args: tuple[str | int, ...]
    parse: Callable[[Any], T] = attrs.field(repr=False)
    #: ``(replicas, timeout_ms)``: the write must be confirmed by that many
    #: replicas. The shells send :func:`confirm_commands` in one pipeline on
    #: one connection and hand :func:`confirmed` of the replies to ``parse``.
    confirm: tuple[int, int] | None = None
    #: When this try's replies must all have come (``time.monotonic()``
    #: seconds), or None: no bound but the client's own socket timeout. The
    #: shells bound every socket read (and a reconnect) of the call by it; a
    #: read that runs out raises redis-py's ``TimeoutError``, which the flow
    #: retries within its deadline like any transport error. Set per try by
    #: the flow (:func:`~.retry.retrying`).
    deadline: float | None = None

    def until(self, deadline: float | None) -> Call[T]:
        """This call, due by ``deadline``."""
        return Call(self.script, self.keys, self.args, self.parse, self.confirm, deadline)


class Wait(NamedTuple):
    """Wait up to ``timeout`` seconds (None: no limit) for the next message
    the client's reader routes to waiter ``lid``; send it, or, when none
    came in time, the reader's :attr:`~.reader.Reader.trouble` (None, or its last error
    while it fails)."""

    lid: str
    timeout: float | None


class Sleep(NamedTuple):
    seconds: float


class Command(NamedTuple):
    """Run a plain Redis command (not a script); the flow reads the reply.
    ``deadline``: as :attr:`Call.deadline`."""

    args: tuple[str, ...]
    deadline: float | None = None


@attrs.define
class End:
    """A cancel or a release to deliver (what a :class:`Defer` carries; the
    client keeps them in :class:`~.pending.Ends`): ``call`` (its try bound
    is set per try), for lease or request ``key``
    (:func:`~.pending.end_key`), kept until ``until`` (monotonic)."""

    what: str
    pool: str
    key: tuple[str, str]
    call: Call[Any] = attrs.field(repr=False)
    until: float


class Defer(NamedTuple):
    """Keep sending ``end`` (a cancel or a release that could not be
    confirmed) in the background until the server answers
    (:mod:`.pending`)."""

    end: End


class Settle(NamedTuple):
    """A call on the lease of ``key`` (:func:`~.pending.end_key`) got the
    server's answer: its end still to deliver, if any, is forgotten. Send
    back whether there was one."""

    key: tuple[str, str]


class Pending(NamedTuple):
    """Send back whether an end of the lease of ``key`` is still to deliver."""

    key: tuple[str, str]


Step = Call[Any] | Wait | Sleep | Command | Defer | Settle | Pending
Flow = Generator[Step, Any, T]


class Beat(NamedTuple):
    """A reader's heartbeat: run each pool's poll call (``(key, call)``, no
    retries of its own); send back the ``(key, parsed reply)`` pairs."""

    calls: list[tuple[str, Call[Any]]]


class Exchange(NamedTuple):
    """A reader's round trip (:func:`round_commands`): acknowledge, block
    on ``keys`` up to ``block`` seconds, pop; send back the popped
    ``(key, message)`` pairs."""

    acks: list[tuple[str, list[str]]]
    keys: list[str]
    block: float


class Deliver(NamedTuple):
    """Put each ``(inbox, item)`` in its waiter's inbox, and release each
    grant whose waiter left (:func:`~.retry.retry_single`). The reader does not
    yield to the woken waiters before its next round: on 2 cores that made
    a 2-process handoff 5 % faster and the throughput of 32 processes 18 %
    slower (docs/performance.md)."""

    items: list[tuple[Any, Any]]
    releases: list[Call[Any]]


class Subscribe(NamedTuple):
    """Subscribe the client's presence connection to ``channels`` again
    (a heartbeat found it absent: the connection dropped, or the server
    lost the subscription in a restart or a failover)."""

    channels: list[str]


ReaderStep = Beat | Exchange | Deliver | Sleep | Subscribe
