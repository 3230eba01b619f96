"""A client's presence (docs/concepts.md#presence-as-a-session): what both
shells decide about it, and carry out on the presence connection
(allocator/_presence.py).

A client that keeps a presence holds one connection subscribed to a channel
named by its id under each pool it waits in (:func:`presence_channel`,
``<pool>:p:<client id>``), and its id starts with :data:`PRESENT`. The
scripts count the channel's subscribers (``PUBSUB SHARDNUMSUB``): a process
that dies has its sockets closed by its kernel, so it is found absent at
once and is gone after :data:`GRACE`; one that is stopped or stalled keeps
its connections, and so its place, until its mark runs out,
:data:`ALIVE_PRESENT` after its last heartbeat. A client without a presence
(the server or the ACL cannot count subscribers, a cluster, fakeredis) is
judged by its liveness mark alone, as in 0.2 (:mod:`.liveness`); the clocks
of a client by its id are :func:`alive_ms`, :func:`heartbeat_of` and
:func:`silence`. (The scripts keep the other side of these rules: GRACE_MS
in lua/prelude_defaults.lua, the marks in lua/prelude_clients.lua.) The
pools in which a client keeps a presence, or cannot, and so its id in
each, are its reader's presence table (:class:`Presences`).

The holder's watch (:class:`Holds`): while the client waits or holds a
lease in a pool where it keeps a presence, a watch listens on the presence
connection, so that a drop is seen the moment it happens, and subscribes
again at once. Each new subscription is followed by the client's own
confirmation of its return in every pool (:func:`present`,
lua/present.lua), which ends whatever absence the scripts found
meanwhile: an absence that ended is never added to a later one.

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

from collections.abc import Callable, Generator
from typing import Any

import attrs

from .base import PoolBase
from .liveness import ALIVE, ALIVE_MS, HEARTBEAT
from .messages import ended_lease
from .pending import Reclaimable
from .replies import _tagged, _unexpected
from .retry import JITTER, RETRY_BUDGET
from .steps import Call, Defer

_jitter = JITTER  # (a name of this module's own, which tests/harness.py fakes)

#: The first characters of the id of a client that keeps a presence.
PRESENT = "p."
#: Longest a client's reader blocks on its signal list before it refreshes
#: the client's liveness mark (:data:`.liveness.HEARTBEAT`), for a client
#: that keeps a presence: its connection answers for it (a dead one is
#: found by its presence, and every release looks at the queue head), so
#: its reader refreshes the mark rarely: waiting then costs its process
#: about 2 commands per heartbeat (the heartbeat and one blocking read),
#: under one a second. No longer, so that a live waiter behind a crowd of
#: dead ones, which only its heartbeat finds, is served within 2.5 s of
#: their death. The reader waits for a blocking read's reply itself, so
#: this may exceed the client's socket timeout.
HEARTBEAT_PRESENT = 2.0
#: The longest silence a client that keeps a presence may keep without its
#: waiters losing their place (:data:`.liveness.ALIVE`): a dead one is told
#: by its connection, so a stalled one can be given room: a live waiter
#: stalled up to 10 s keeps its place (docs/concepts.md, 'Liveness marks,
#: presence and dead waiters').
ALIVE_PRESENT = 11.0
#: How long a client that keeps a presence may be absent (no subscriber on
#: its channel) before it counts as gone, counted from the first script run
#: that found it so: a reconnect's time (GRACE_MS in lua/prelude_defaults.lua).
GRACE = 1.0
#: The longest pause between two tries of what keeps a waiter's place (its
#: reader's rounds, its own looks at the queue) while the server is out of
#: reach: after a restart or a failover, its client must be subscribed
#: again well within the grace, or its waiters lose their place for the
#: outage.
WAITER_BACKOFF = GRACE / 2
#: The liveness mark a refresh sets, in ms, for a client that keeps a
#: presence (:data:`.liveness.ALIVE_MS`).
ALIVE_PRESENT_MS = round((ALIVE_PRESENT + HEARTBEAT_PRESENT) * 1000)


def presence_budget(timeout: float | None) -> float:
    """How long an acquire may spend setting up its client's presence in a
    pool (its first wait there): half the single-call budget, or of the
    acquire's own (checked) timeout if that is shorter, so that the flow's
    own tries keep the other half (a server that accepts connections and
    never answers costs the acquire its timeout, not more)."""
    return max(min(RETRY_BUDGET if timeout is None else timeout, RETRY_BUDGET) / 2, 0.05)


def alive_ms(cid: str) -> int:
    """The liveness mark (ms) that client ``cid`` sets at each refresh."""
    return ALIVE_PRESENT_MS if cid.startswith(PRESENT) else ALIVE_MS


def heartbeat_of(cid: str) -> float:
    """How often the reader of client ``cid`` refreshes its mark, at the
    longest."""
    return HEARTBEAT_PRESENT if cid.startswith(PRESENT) else HEARTBEAT


def silence(cid: str) -> float:
    """The longest silence client ``cid`` may keep without losing its place."""
    return ALIVE_PRESENT if cid.startswith(PRESENT) else ALIVE


# -- the presence table -----------------------------------------------------------


def presence_channel(pool: PoolBase, cid: str) -> str:
    """The channel whose subscriber is client ``cid``'s presence in
    ``pool`` (``<prefix>:{<name>}:p:<cid>``: in the pool's cluster slot)."""
    return pool.keys[-1][: -len("s:")] + "p:" + cid


def present(pool: PoolBase, cid: str) -> Call[int]:
    """Client ``cid`` confirms its return to ``pool`` (lua/present.lua):
    1 if the server counts its presence connection now (an absence it had
    found is over), 0 if not (it dropped again: confirm on the next one),
    -1 if the server cannot tell."""

    def parse(reply: Any) -> int:
        tag, rest = _tagged("present", reply)
        if tag != "present" or len(rest) != 1:
            raise _unexpected("present", reply)
        return int(rest[0])

    return Call("present", pool.keys, (cid,), parse)


class Presences:
    """The presence table of one client's reader: the pools in which the
    client keeps a presence (its shell subscribed to the pool's channel
    for it), or cannot, and so its id in each."""

    def __init__(self, cid: str) -> None:
        #: The client's plain id (its reader's).
        self.cid = cid
        #: Pools (by their first key) in which this client keeps a presence
        #: (its channel there) or cannot (None); a pool not in it is not yet
        #: decided.
        self._presence: dict[str, str | None] = {}
        #: The pools where it keeps one, to confirm its return there after
        #: each (re)subscription (:func:`present`).
        self._present_in: dict[str, PoolBase] = {}

    @property
    def present_cid(self) -> str:
        """The client's id where it keeps a presence (:data:`PRESENT`)."""
        return PRESENT + self.cid

    def channel(self, pool: PoolBase) -> str:
        """The client's presence channel in ``pool``."""
        return presence_channel(pool, self.present_cid)

    def decided(self, pool: PoolBase) -> bool:
        return pool.keys[0] in self._presence

    def decide(self, pool: PoolBase, kept: bool) -> None:
        """Whether this client keeps a presence in ``pool``: its shell
        subscribed to the pool's channel for it, or could not (it waits
        there under the plain id, judged by its mark alone)."""
        channel = self.channel(pool) if kept else None
        self._presence.setdefault(pool.keys[0], channel)
        if self._presence[pool.keys[0]] is not None:
            self._present_in.setdefault(pool.keys[0], pool)

    def forget(self) -> None:
        """The presence connection was closed: every pool decides again."""
        self._presence.clear()
        self._present_in.clear()

    def kept(self, pool: PoolBase) -> bool:
        """Whether this client keeps a presence in ``pool``."""
        return bool(self._presence.get(pool.keys[0]))

    def cid_for(self, pool: PoolBase) -> str:
        """The client's id in ``pool``."""
        return self.present_cid if self.kept(pool) else self.cid

    def channels(self) -> list[str]:
        """The presence channels of the pools where this client keeps one
        (waited in, or only held a lease in)."""
        return [channel for channel in self._presence.values() if channel is not None]

    def confirms(self) -> list[Call[int]]:
        """After each (re)subscription of the presence connection: the
        client's confirmation of its return in each pool where it keeps a
        presence (:func:`present`), which ends the absence the scripts may
        have started meanwhile, so that it is never added to a later one."""
        return [present(pool, self.present_cid) for pool in self._present_in.values()]


# -- the holder's watch ---------------------------------------------------------

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
        the presence channel, lua/prelude_clients.lua ``P:tell_end``): it is lost
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
        return _jitter.uniform(pause / 2, pause)

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


# -- the watch: what it does, decided here; its shells carry it out ----------


@attrs.frozen
class Listen:
    """Listen on the presence connection for ``period`` seconds. The reply:
    the messages heard (a list, maybe empty), or None if the connection is
    down."""

    period: float


@attrs.frozen
class Probe:
    """PING the presence connection (at most :data:`PROBE_WAIT` seconds).
    The reply: the presence's answer, for :meth:`Holds.probed`."""


@attrs.frozen
class Pause:
    """Wait ``seconds`` (the sync shell ends the pause early when the watch
    is asked to stop)."""

    seconds: float


@attrs.frozen
class Confirm:
    """Confirm the client's return in every pool where it keeps a presence
    (the shell's ``_confirm_return``): whatever absence the scripts found
    is over."""


@attrs.frozen
class Resubscribe:
    """Subscribe the presence again on a new connection, then confirm the
    return (the shell's ``_subscribe_again``). The reply: None if it was
    done; else whether the server refused it (an ACL: :func:`allocator._presence.refused`)."""

    channels: list[str]


@attrs.frozen
class GiveUp:
    """Hand the releases of the reclaimable leases the watch gave up to the
    client's sender: the server may still hold them (allocator/_core/pending.py)."""

    releases: list[Defer]


#: The steps of :func:`watch`.
WatchStep = Listen | Probe | Pause | Confirm | Resubscribe | GiveUp


def watch(
    holds: Holds,
    presences: Presences,
    reclaimable: Reclaimable,
    waiting: Callable[[], bool],
    clock: Callable[[], float],
    stopped: Callable[[], bool],
) -> Generator[WatchStep, Any, None]:
    """The presence watch: listens on the presence connection while the
    client waits or holds, so that a drop is met at once and the client
    subscribes again and confirms its return well within the grace; PINGs
    it while a reclaimable lease is held. Ends once nothing has been held
    for a while and nobody waits (:meth:`Holds.period`), or when
    ``stopped()``. ``reclaimable``: the reader's reclaimable leases;
    ``clock``: the shell's monotonic clock. A shell that shares ``holds``
    between threads runs each step of this generator (the code between two
    yields) under its lock, and the steps themselves outside it."""
    while True:
        now = clock()
        # (given_up calls it at once: `now` is this turn's.)
        handed = reclaimable.given_up(lambda lid: holds.lost(lid, now), now)  # noqa: B023
        if handed:
            yield GiveUp(handed)
        period = holds.period(clock(), waiting())
        if period is None or stopped():
            return
        if holds.fresh:  # the last confirmation of the return failed
            yield Confirm()
        heard = yield Listen(period)
        if heard:  # the ends of leases the server told (Holds.heard)
            holds.heard(heard)
        if stopped():
            continue
        if heard is not None:  # connected
            if not holds.probing:
                continue
            sent = clock()
            answer = yield Probe()
            if not holds.probed(answer, sent, clock()):
                continue
        channels = presences.channels()
        if not channels:
            yield Pause(period)
            continue
        tried = clock()
        refused = yield Resubscribe(channels)
        if refused is not None:  # it failed: tried again after a short pause
            if refused:
                holds.refused(tried)
            yield Pause(holds.retry_in())
