"""The leases a client holds in this process, as its presence watch sees
them (CONTRACT.md section 11): the decisions, shared by both shells, which
probe the presence connection and carry them out.

While the client holds a lease in a pool where it keeps a presence, a watch
sends a PING on the presence connection every :func:`Holds.period`
seconds. A holder that never waits has no reader rounds, whose heartbeat
would otherwise notice a presence the server lost (a restart, a failover)
and subscribe again: the watch does, when the connection breaks or stops
answering.

A lease acquired with ``reclaim_on_disconnect`` ends on the server once
its holder has been absent (no subscriber on its channel) for the grace,
counted from the first script that found it so, which can only be after
the last PING its presence answered. So its holder gives it up by itself
once its presence has gone unconfirmed for longer than the grace since
then (a partition, a connection the server dropped, subscribed again too
late): from then on, ``renew`` and the exit of ``lease()`` raise
``LeaseLost``. A stall of the whole process (SIGSTOP) loses nothing: the
connection stays open, and the first PING after it is answered. Nor does a
restart of the server, however long, where a connection refused shows
that it was down (no script ran), and the presence is subscribed again
within the grace of its return."""

from __future__ import annotations

import attrs

from .liveness import GRACE, HEARTBEAT

#: How often the watch sends a PING while a lease that ends with its
#: holder's presence is held: a connection that broke is subscribed again
#: well within the grace (the server then never ends the lease).
PROBE = 0.25
#: How long a PING may go unanswered before the connection counts as
#: unconfirmed since its last answer.
PROBE_WAIT = 0.25
#: How long the connection may stay unconfirmed before the watch gives it
#: up and subscribes on a new one.
GIVE_UP = 2.0
#: How long the watch stays once nothing is held (a worker that acquires
#: and releases in a loop keeps one watch).
LINGER = 5.0


@attrs.define
class _Held:
    since: float
    until: float
    reclaim: bool


class Holds:
    """What one client holds in this process, and what its presence
    connection showed (times: monotonic seconds)."""

    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}
        self._lost: set[str] = set()
        #: When the connection was last confirmed: the sending of a PING it
        #: answered, or the confirmation of a subscription.
        self._ok_at = float("-inf")
        #: The last confirmation before the connection stopped answering,
        #: while it does not (None: it answers).
        self._down_since: float | None = None
        #: Since when nothing is held (None: something is).
        self._idle_since: float | None = float("-inf")

    def hold(self, lid: str, now: float, ttl: float, reclaim: bool) -> None:
        """Lease ``lid`` was granted (``reclaim``: it ends with its holder's
        presence)."""
        self._held[lid] = _Held(now, now + ttl, reclaim)
        self._idle_since = None

    def renewed(self, lid: str, now: float, ttl: float) -> None:
        held = self._held.get(lid)
        if held is not None:
            held.until = now + ttl

    def drop(self, lid: str, now: float) -> None:
        """Lease ``lid`` ended here (released, or found lost)."""
        self._held.pop(lid, None)
        self._lost.discard(lid)
        if not self._held:
            self._idle_since = now

    def lost(self, lid: str, now: float) -> bool:
        """Whether this process must give up lease ``lid``: its presence
        went unconfirmed for longer than the grace while it was held."""
        if lid in self._lost:
            return True
        held = self._held.get(lid)
        if held is None or not held.reclaim or self._down_since is None:
            return False
        if now - max(self._down_since, held.since) > GRACE:
            self._lost.add(lid)
            return True
        return False

    def confirmed(self, at: float) -> None:
        """The connection was confirmed at ``at``: a PING sent then was
        answered, or a new subscription was confirmed then. After a gap
        longer than the grace, what was held through it is lost."""
        if self._down_since is not None:
            for lid, held in self._held.items():
                if held.reclaim and at - max(self._down_since, held.since) > GRACE:
                    self._lost.add(lid)
            self._down_since = None
        self._ok_at = max(self._ok_at, at)

    def unanswered(self) -> None:
        """A PING went unanswered, or the connection broke."""
        if self._down_since is None:
            self._down_since = self._ok_at

    def probed(self, answer: bool | None, sent: float, now: float) -> bool:
        """The PING sent at ``sent`` was answered (``answer`` True), not yet
        (False), or the connection broke (None). Returns whether the watch
        subscribes again on a new connection."""
        if answer:
            self.confirmed(sent)
            return False
        self.unanswered()
        return answer is None or self.hopeless(now)

    def refused(self, at: float) -> None:
        """A connection to the server, tried at ``at``, was refused: the
        server was not running then, so no script can have found this
        client absent before (a restart). Only for a client with one
        server address: a refusal from a master that failed says nothing
        of the new one."""
        if self._down_since is not None:
            self._down_since = max(self._down_since, at)

    def hopeless(self, now: float) -> bool:
        """Whether the connection has gone unconfirmed so long that the
        watch subscribes on a new one."""
        return self._down_since is not None and now - self._down_since > GIVE_UP

    def period(self, now: float) -> float | None:
        """How long the watch sleeps before its next PING; None once
        nothing has been held for :data:`LINGER` (the watch ends). A lease
        past its deadline (never released: the server ended it) is
        forgotten."""
        for lid in [lid for lid, held in self._held.items() if held.until < now]:
            self.drop(lid, now)
        if any(held.reclaim for held in self._held.values()):
            return PROBE
        if self._held:
            return HEARTBEAT
        if self._idle_since is None or now - self._idle_since <= LINGER:
            return HEARTBEAT
        return None

    @property
    def holding(self) -> bool:
        return bool(self._held)
