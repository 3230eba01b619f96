"""The ends a client still has to deliver: cancels of tickets whose acquire
gave up, and releases, that could not be confirmed
(docs/concepts.md#ends-still-to-deliver).

A cancel or a release whose last try met a transport error may or may not
have reached the server: a stalled server (SIGSTOP, ``DEBUG SLEEP``) runs
what it finds buffered once it goes on, so an acquire that timed out in the
stall is granted to nobody after it; a partition loses what was sent. Both
scripts can run any number of times (a second cancel or release finds
nothing to do; a cancel that finds its ticket granted passes the grant on),
so the client keeps such an end and a background sender (a daemon thread,
or a task, of the shells) sends it again as soon as the server answers,
then ends once nothing is left. The decisions are here:

- what is kept: an :class:`End`, by ``(pool, lease id)``; a second end of
  the same lease merges with the first (the later of their bounds);
- until when: the lease's ttl from the hand-over (a renewal can have pushed
  the deadline no further; after it the server ends the lease by itself);
- how often: as soon as the server answers, each try bounded by
  :data:`TRY`, tries apart by a full-jitter backoff of at most :data:`CAP`;
- what a later call of the same lease means: a release that got the
  server's answer settles it (:class:`~.steps.Settle`); a renew of a lease
  whose release is pending raises ``LeaseLost`` (:class:`~.steps.Pending`):
  the release may reach the server after the renewal;
- a lease given up by the presence watch (``reclaim_on_disconnect``) is
  released the same way (:class:`Reclaimable`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from typing import Any

import attrs

from .._values import Lease
from .replies import _tagged
from .retry import RETRY_BUDGET, Retrier
from .steps import Call, Defer, End, Pending, Settle, Sleep

_log = logging.getLogger("allocator")

#: How long ``release`` and ``renew`` keep trying before they give up (at
#: least; a Sentinel-managed client's budget is longer): a ``CLIENT PAUSE``
#: or a stall of a few seconds is ridden out, not reported as a failure.
RIDE_OUT = 5.0


def renew_budget(call_budget: float, ttl: float) -> float:
    """How long a renew of a lease of ``ttl`` seconds keeps trying: as a
    release, but no longer than half the ttl (never less than a plain
    call's budget). A renew stuck past that holds up its caller while the
    lease drains, and a ``reclaim_on_disconnect`` holder learns only at its
    next renew that it gave the lease up, which must come before the
    server grants it again."""
    return max(call_budget, min(RIDE_OUT, ttl / 2))


#: The longest one try of a pending end waits for its reply.
TRY = 1.0
#: The backoff between two tries while the server does not answer: full
#: jitter, from BASE up to CAP, so that the end goes out within about CAP
#: of the server's return.
BASE = 0.05
CAP = 0.5
#: How long ``close()`` waits for the client's pending ends to be
#: delivered before it drops them (their leases end at their deadlines).
CLOSE_WAIT = RETRY_BUDGET

#: An end's key: (the pool's first key, the lease id).
Key = tuple[str, str]


def end_key(keys: tuple[str, ...], lid: str) -> Key:
    return (keys[0], lid)


def _tag(reply: Any) -> str:
    return _tagged("end", reply)[0]


def cancel_end(
    pool: str, keys: tuple[str, ...], call: Call[Any], lid: str, ttl: float, now: float
) -> End:
    """The cancel ``call`` of request ``lid`` whose acquire gave up: its
    ticket may yet be granted a lease of ``ttl`` seconds."""
    return End(
        "cancel", pool, end_key(keys, lid), Call(call.script, call.keys, call.args, _tag), now + ttl
    )


def release_end(pool: str, call: Call[Any], lease: Lease, now: float) -> End:
    """The release ``call`` of ``lease`` (sent with the caller's arguments)."""
    return End(
        "release",
        pool,
        end_key(call.keys, lease.id),
        Call(call.script, call.keys, call.args, _tag),
        now + lease.ttl,
    )


class Ends:
    """The ends one client still has to deliver (in one process). The
    shells carry out :meth:`apply` for a flow's steps, and drive
    :meth:`sending` in their sender while :attr:`waiting` (under one lock
    in the sync shell: both change the ends)."""

    def __init__(self) -> None:
        self._ends: dict[Key, End] = {}

    def __len__(self) -> int:
        return len(self._ends)

    @property
    def waiting(self) -> bool:
        return bool(self._ends)

    def apply(self, step: Defer | Settle | Pending) -> bool:
        """Carry out a flow's step: keep ``Defer.end`` (True), forget the end
        of ``Settle.key`` or say whether one is kept for ``Pending.key``
        (whether one was)."""
        if isinstance(step, Defer):
            self.add(step.end)
            return True
        if isinstance(step, Settle):
            return self._ends.pop(step.key, None) is not None
        return step.key in self._ends

    def add(self, end: End) -> None:
        kept = self._ends.get(end.key)
        if kept is not None:
            kept.until = max(kept.until, end.until)
            if end.what == "release":  # its arguments (a quarantine) win
                kept.what, kept.call = end.what, end.call
            return
        self._ends[end.key] = end
        _log.info(
            "allocator: pool %r: %s of %s not confirmed; sent again once Redis answers",
            end.pool,
            end.what,
            end.key[1],
        )

    def drop_all(self) -> list[End]:
        """Forget every end (``close()`` ran out of time): what was dropped."""
        dropped = list(self._ends.values())
        self._ends.clear()
        for end in dropped:
            _log.warning(
                "allocator: pool %r: %s of %s dropped undelivered at close; "
                "its lease ends at its deadline",
                end.pool,
                end.what,
                end.key[1],
            )
        return dropped

    def sending(self, clock: Callable[[], float]) -> Generator[Call[Any] | Sleep, Any, None]:
        """The sender's flow: each end in turn, again after a backoff while
        the server does not answer, until none is left. Ends past their
        bound are dropped; an end that meets a permanent error too."""
        retrier = Retrier("pending ends", base=BASE, cap=CAP)
        while True:
            now = clock()
            for end in [end for end in self._ends.values() if end.until <= now]:
                del self._ends[end.key]
                _log.warning(
                    "allocator: pool %r: %s of %s not delivered within its lease's ttl; "
                    "the server has ended it by now",
                    end.pool,
                    end.what,
                    end.key[1],
                )
            if not self._ends:
                return
            end = next(iter(self._ends.values()))
            try:
                tag = yield end.call.until(now + TRY)
            except Exception as exc:
                delay = retrier.next_delay(exc)
                if delay is None:
                    if self._ends.get(end.key) is end:
                        del self._ends[end.key]
                    _log.warning(
                        "allocator: pool %r: %s of %s dropped: %r",
                        end.pool,
                        end.what,
                        end.key[1],
                        exc,
                    )
                    continue
                # The others wait for the same server: this one goes last.
                if self._ends.get(end.key) is end:
                    del self._ends[end.key]
                    self._ends[end.key] = end
                yield Sleep(delay)
                continue
            retrier.succeeded()
            if self._ends.get(end.key) is end:
                del self._ends[end.key]
            _log.info(
                "allocator: pool %r: %s of %s delivered: %s", end.pool, end.what, end.key[1], tag
            )


@attrs.define
class _Kept:
    pool: str
    keys: tuple[str, ...]
    lease: Lease
    until: float


class Reclaimable:
    """The ``reclaim_on_disconnect`` leases a client holds, for the release
    of those its presence watch gives up (``Holds.lost``): the server may
    still hold them (a stall keeps the presence connection open), so they
    are released there as soon as it answers."""

    def __init__(self) -> None:
        self._kept: dict[str, _Kept] = {}

    def hold(self, pool: str, keys: tuple[str, ...], lease: Lease, now: float) -> None:
        self._kept[lease.id] = _Kept(pool, keys, lease, now + lease.ttl)

    def renewed(self, lease: Lease, now: float) -> None:
        kept = self._kept.get(lease.id)
        if kept is not None:
            kept.lease, kept.until = lease, now + lease.ttl

    def drop(self, lid: str) -> None:
        self._kept.pop(lid, None)

    def given_up(self, lost: Callable[[str], bool], now: float) -> list[Defer]:
        """The releases to hand over for the leases given up since the last
        look (each once); leases past their bound are forgotten."""
        handed = []
        for lid, kept in list(self._kept.items()):
            if kept.until <= now:
                del self._kept[lid]
            elif lost(lid):
                del self._kept[lid]
                lease = kept.lease
                call = Call("release", kept.keys, (lease.id, lease.ticket, "", ""), _tag)
                handed.append(
                    Defer(End("release", kept.pool, end_key(kept.keys, lid), call, kept.until))
                )
        return handed
