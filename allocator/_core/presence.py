"""A client's presence as a session, as its watch sees it
(docs/concepts.md, "Presence as a session"): the decisions, shared by both
shells, which listen on the presence connection, probe it and carry them
out.

While the client waits or holds a lease in a pool where it keeps a
presence, a watch listens on the presence connection, so that a drop is
seen the moment it happens, and subscribes again at once. Each new
subscription is followed by the client's own confirmation of its return
in every pool (lua/present.lua), which ends whatever absence the scripts
found meanwhile: an absence that ended is never added to a later one.

A lease acquired with ``reclaim_on_disconnect`` ends on the server once
its holder has been absent (no subscriber on its channel) without a break
for the grace, counted from a script that found it so after its last
confirmed return. Such an absence can only start after the last moment
the client knows its connection was counted: the sending of a PING that
the connection answered after that return was confirmed, or of the
confirmation itself. So the client's presence is *present* while the
connection answers, *suspended* from the moment it drops or stops
answering until the server has confirmed its return, and *lost* once it
has been suspended for :data:`SAFE`, a part of the grace: its
reclaimable leases are then given up here (``lost()``, ``LeaseLost`` from
``renew`` and at the exit of ``lease()``), always before the server can
end them. While one is held the watch also PINGs every :data:`PROBE`
seconds, which tells a connection that stopped answering (a partition)
from one that is idle.

A stall of the whole process (SIGSTOP) loses nothing: the connection stays
open, and the first PING after it is answered. Nor does a restart of the
server, however long, where a connection refused shows that it was down
(no script ran), and the presence is subscribed again and confirmed within
the grace of its return. A holder without a reclaimable lease sends
nothing periodic: the connection's close is all the server needs."""

from __future__ import annotations

import random

import attrs

from .liveness import GRACE
from .messages import ended_lease

#: How often the watch sends a PING while a lease that ends with its
#: holder's presence is held, so that a connection that stopped answering
#: is known within a part of the grace (one that breaks is seen at once).
PROBE = 0.25
#: How long a PING may go unanswered before the connection counts as
#: unconfirmed since its last answer.
PROBE_WAIT = 0.25
#: How long the connection may stay unconfirmed before the watch gives it
#: up and subscribes on a new one.
GIVE_UP = 2.0
#: How long the watch stays once nothing is held and nobody waits (a
#: worker that acquires and releases in a loop keeps one watch).
LINGER = 5.0
#: How long the watch listens on the connection at a time while no
#: reclaimable lease is held (a drop wakes it at once; nothing is sent).
LISTEN = 0.25
#: The pauses between two tries to subscribe again while the server cannot
#: be reached or refuses: the first short, doubling up to the last, so that
#: a connection that is back is met within a few ms and many tries fit in
#: the grace (:meth:`Holds.retry_in`).
RESUBSCRIBE_FIRST = 0.005
RESUBSCRIBE_PAUSE = 0.1
#: How long the client's presence may stay suspended (dropped, or not
#: answering, and its return not yet confirmed by the server) before its
#: reclaimable leases are given up here: a part of the grace, so that the
#: holder always knows before the server may end them. The rest of the
#: grace covers the time between the client's last confirmation and the
#: script that found it absent, which can only be later, and a difference
#: of a few percent between the rates of the two clocks.
SAFE = 0.75 * GRACE


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
        #: Tries to subscribe again that failed in a row.
        self._failures = 0
        #: A new subscription whose return the server has not confirmed
        #: yet (lua/present.lua): a PING it answers confirms nothing, since
        #: an absence found before it may still be counting.
        self._fresh = False
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

    def ended(self, lid: str) -> None:
        """The server said that lease ``lid`` ended (revoked, reclaimed, its
        resource removed or its pool deleted by force: ``e|<lease id>`` on
        the presence channel, lua/prelude.lua ``P:tell_end``): it is lost
        from now on, whatever the presence. A lease not held here (already
        dropped, or past its deadline) is no concern."""
        if lid in self._held:
            self._lost.add(lid)

    def heard(self, messages: list[str]) -> None:
        """What the presence connection read (``Presence.listen``): each
        end of a lease is taken (:meth:`ended`); anything else is passed
        over."""
        for message in messages:
            lid = ended_lease(message)
            if lid is not None:
                self.ended(lid)

    def lost(self, lid: str, now: float) -> bool:
        """Whether this process must give up lease ``lid``: the server said
        it ended (:meth:`ended`), or its presence was suspended for longer
        than :data:`SAFE` while it was held."""
        if lid in self._lost:
            return True
        held = self._held.get(lid)
        if held is None or not held.reclaim or self._down_since is None:
            return False
        if now - max(self._down_since, held.since) > SAFE:
            self._lost.add(lid)
            return True
        return False

    @property
    def suspended(self) -> bool:
        """The connection dropped or stopped answering, and the server has
        not confirmed the client's return since."""
        return self._down_since is not None

    def confirmed(self, at: float) -> None:
        """The connection was confirmed at ``at``: a PING sent then was
        answered after the return was confirmed, or the server confirmed
        the return (:meth:`returned`). After a suspension longer than
        :data:`SAFE`, what was held through it is lost."""
        if self._down_since is not None:
            for lid, held in self._held.items():
                if held.reclaim and at - max(self._down_since, held.since) > SAFE:
                    self._lost.add(lid)
            self._down_since = None
        self._ok_at = max(self._ok_at, at)

    def resubscribing(self) -> None:
        """A new subscription starts (the connection broke, or the server
        lost it): suspended until the server confirms the return."""
        self.unanswered()
        self._fresh = True

    def returned(self, at: float) -> None:
        """The server confirmed the client's return in every pool where it
        keeps a presence (lua/present.lua), asked at ``at``."""
        self._fresh = False
        self._failures = 0
        self.confirmed(at)

    def retry_in(self) -> float:
        """A try to subscribe again failed: how long to pause before the
        next (jittered, doubling from :data:`RESUBSCRIBE_FIRST` up to
        :data:`RESUBSCRIBE_PAUSE`)."""
        self._failures += 1
        pause = min(RESUBSCRIBE_FIRST * 2 ** min(self._failures - 1, 16), RESUBSCRIBE_PAUSE)
        return random.uniform(pause / 2, pause)

    @property
    def fresh(self) -> bool:
        """A new subscription awaits the server's confirmation."""
        return self._fresh

    def unanswered(self) -> None:
        """A PING went unanswered, or the connection broke."""
        if self._down_since is None:
            self._down_since = self._ok_at

    def probed(self, answer: bool | None, sent: float, now: float) -> bool:
        """The PING sent at ``sent`` was answered (``answer`` True), not yet
        (False), or the connection broke (None). Returns whether the watch
        subscribes again on a new connection."""
        if answer and not self._fresh:
            self.confirmed(sent)
            return False
        if answer:  # answered, but the return is not confirmed yet
            return self.hopeless(now)
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

    def period(self, now: float, waiting: bool = False) -> float | None:
        """How long the watch listens before it looks again; None once
        nothing has been held for :data:`LINGER` and nobody waits (the
        watch ends). A lease past its deadline (never released: the server
        ended it) is forgotten."""
        for lid in [lid for lid, held in self._held.items() if held.until < now]:
            self.drop(lid, now)
        if self.probing:
            return PROBE
        if self._held or waiting:
            return LISTEN
        if self._idle_since is not None and now - self._idle_since > LINGER:
            return None
        return LISTEN

    @property
    def probing(self) -> bool:
        """A lease that ends with its holder's presence is held: the watch
        PINGs the connection every :data:`PROBE` seconds."""
        return any(held.reclaim for held in self._held.values())

    @property
    def holding(self) -> bool:
        return bool(self._held)
