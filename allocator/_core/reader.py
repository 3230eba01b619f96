"""The reader's decisions: one reader per Redis client and process (and per
event loop for asyncio) serves every waiter of that client, in every pool.
:class:`Reader` decides its rounds (heartbeats, the round trip that
acknowledges, blocks and pops, the routing of each message to its waiter,
failures); the shells carry them out with a thread or a task."""

from __future__ import annotations

import collections
import logging
import secrets
import time
from collections.abc import Callable, Generator
from typing import Any

import attrs

from .keys import PICK
from .liveness import ACK_GIVE_UP
from .messages import DELETED, GRANT, RECHECK, request_of, target
from .pool import Pool
from .presence import WAITER_BACKOFF, Presences, alive_ms, heartbeat_of, silence
from .replicas import check_slot
from .replies import _decode, _tagged, _unexpected
from .retry import BACKOFF_BASE, BACKOFF_CAP, JITTER, Retrier
from .steps import Beat, Call, Deliver, Exchange, ReaderStep, Sleep, Subscribe

_jitter = JITTER  # (a name of this module's own, which tests/harness.py fakes)

_log = logging.getLogger("allocator")

#: Messages a reader pops from one signal list per round trip.
BATCH = 256
#: Delivered grants a reader remembers, so that a grant message it sees again
#: (put back on the list after a lost reply) is not taken for a stray one.
RECENT = 4096


@attrs.define(eq=False)
class _Served:
    """A pool whose waiters a reader serves: its signal list for the reader's
    client, the waiters (probed in turn), grants delivered but not yet
    acknowledged, and the pool's epoch last seen."""

    pool: Pool
    key: str
    #: The client's id in this pool (its presence decides: presence.py).
    cid: str
    lids: collections.OrderedDict[str, None] = attrs.field(factory=collections.OrderedDict)
    acks: list[str] = attrs.field(factory=list)
    epoch: str | None = None


class Reader:
    """What the reader of one client (one per Redis client and process, and
    per event loop for asyncio) decides, for every pool it serves. Pure:
    the shells' readers carry out its plans with a thread or a task, and the
    sync one holds a lock around every call.

    One round of a reader: send the acknowledgements of the grants it
    delivered last round (``ZREM`` of their lease ids from each pool's
    ``pick``), block on the signal lists of the pools that have waiters,
    pop what else is there (``BLPOP`` then ``LPOP key BATCH`` per list, in
    one round trip), and route each message to the waiter it names. Once a
    heartbeat interval, a poll per pool keeps the client's waiters alive.
    """

    def __init__(self, heartbeat: float) -> None:
        #: The client's id in the pools' liveness marks and signal lists. A
        #: reader lives in one process: a forked child makes its own.
        self.cid = secrets.token_urlsafe(9)
        self.heartbeat = heartbeat
        #: The pools in which this client keeps a presence, or cannot.
        self.presences = Presences(self.cid)
        self._waiters: dict[str, tuple[_Served, Any]] = {}
        self._served: dict[str, _Served] = {}
        self._recent: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._last_beat: float | None = None
        #: When a heartbeat must come sooner than its interval: a pool's
        #: head is absent and counts as gone then (``due_ms`` of poll.lua).
        self._due: float | None = None
        #: A round failed since the last heartbeat: beat first when the
        #: server answers again (see failed()).
        self._beat_soon = False
        #: The error of the reader's last round while it fails (None once a
        #: round goes through): a waiter whose time runs out meanwhile
        #: chains it to its AcquireTimeout.
        self.trouble: BaseException | None = None
        # The next heartbeat after an outage refreshes the client and
        # subscribes it again (presence.WAITER_BACKOFF).
        self._retrier = Retrier("waiting-list reader", cap=WAITER_BACKOFF)
        self._refusals = 0
        self._failing_since: float | None = None

    # -- presence -------------------------------------------------------------

    def forget_presence(self) -> None:
        """The presence connection was closed (close()): every pool decides
        again at its next wait (:meth:`Presences.forget
        <.presence.Presences.forget>`). Only while nobody waits."""
        assert not self._waiters, "presence forgotten under waiters"
        self.presences.forget()
        self._served = {k: s for k, s in self._served.items() if s.acks}

    # -- waiters ------------------------------------------------------------

    def register(self, pool: Pool, lid: str, inbox: Any) -> None:
        cid = self.presences.cid_for(pool)
        key = pool.signal_key(cid)
        served = self._served.get(key)
        if served is None:
            served = self._served[key] = _Served(pool, key, cid)
        served.lids[lid] = None
        self._waiters[lid] = (served, inbox)

    def unregister(self, lid: str) -> None:
        # The pool stays known (a few strings per pool): a grant popped
        # after its waiter left must still be released.
        entry = self._waiters.pop(lid, None)
        if entry is not None:
            entry[0].lids.pop(lid, None)

    def inbox(self, lid: str) -> Any:
        return self._waiters[lid][1]

    @property
    def waiting(self) -> bool:
        """Some waiter of this client is registered."""
        return bool(self._waiters)

    @property
    def idle(self) -> bool:
        """Nothing to wait for and nothing to acknowledge: the reader stops."""
        return not self._waiters and not any(s.acks for s in self._served.values())

    # -- a round ------------------------------------------------------------

    def beat_in(self, now: float) -> float:
        """Seconds until the next heartbeat is due (<= 0: now)."""
        if self._last_beat is None:
            self._last_beat = now
        if self._beat_soon:
            return 0.0
        beat = self.interval() - (now - self._last_beat)
        return beat if self._due is None else min(beat, self._due - now)

    def interval(self) -> float:
        """How often the heartbeat comes: for the clients ids of the pools
        with waiters (a client that keeps a presence beats rarely:
        presence.HEARTBEAT_PRESENT), within the reader's own bound."""
        cids = {s.cid for s in self._served.values() if s.lids}
        return min([self.heartbeat, *(heartbeat_of(cid) for cid in cids)])

    def beats(self) -> list[tuple[str, Call[Beaten]]]:
        """The heartbeat of each pool with waiters, probing one of them in turn."""
        calls = []
        for served in self._served.values():
            if served.lids:
                probe = next(iter(served.lids))
                served.lids.move_to_end(probe)
                calls.append((served.key, heartbeat(served.pool, served.cid, probe)))
        return calls

    def beaten(self, now: float, results: list[tuple[str, Beaten]]) -> tuple[list[Any], bool, bool]:
        """After the heartbeats: the inboxes to tell to look again, whether
        to beat again at once (dead tickets left at a pool's head), and
        whether the client's presence must be subscribed again (a pool found
        no subscriber on its channel: the connection dropped, a restart or
        a failover lost the subscription).

        A pool's waiters look again if its epoch changed (its data was
        lost), if the probed waiter's ticket vanished, or if the reader was
        silent past the liveness window (its client may have been taken for
        gone, its tickets dropped, its grants taken back)."""
        silent = self._silent(now)
        self._last_beat = now
        self._beat_soon = False
        self._due = None
        inboxes: list[Any] = []
        again = resubscribe = False
        for key, (epoch, probe_ok, more, present, due) in results:
            if due is not None:
                # (A little after the grace's end, so that the first beat
                # then finds it over.)
                at = now + due + DUE_SLACK
                self._due = at if self._due is None else min(self._due, at)
            served = self._served.get(key)
            if served is None:
                continue
            if recheck_after_beat(epoch, served.epoch, probe_ok, silent > silence(served.cid)):
                inboxes += [self._waiters[lid][1] for lid in served.lids]
            served.epoch = epoch
            again = again or more
            resubscribe = resubscribe or present == 0
        # Dead tickets left at a head: the next beat comes at once.
        self._beat_soon = again
        return inboxes, again, resubscribe

    def all_inboxes(self) -> list[Any]:
        return [inbox for _, inbox in self._waiters.values()]

    # -- trouble ------------------------------------------------------------

    def failed(self, error: BaseException) -> tuple[float, list[Any]]:
        """A round (or a heartbeat) failed with ``error``: how long the
        reader pauses, and the inboxes of the waiters that must look by
        themselves.

        A transient error (the server unreachable, failing over) is retried
        with jittered backoff while the waiters wait; one whose time runs
        out meanwhile chains :attr:`trouble` to its AcquireTimeout. Any
        other error (a wrong password, an ACL refusal, a bug) is not the
        reader's to retry for ever: every waiter looks by itself, so that
        its own call raises the error at once, and the reader backs off
        until they have left or the error has passed."""
        self.trouble = error
        # The server may have restarted or failed over, which drops every
        # presence at once: the first thing once it answers again is a
        # heartbeat, which subscribes the client again if it finds it
        # absent, well within the grace (a heartbeat due up to a second
        # later cost a waiter its place now and then).
        self._beat_soon = True
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        if not self._waiters and now - self._failing_since > ACK_GIVE_UP:
            # Only acknowledgements left, and too late to matter: stop.
            for served in self._served.values():
                served.acks.clear()
            return 0.0, []
        delay = self._retrier.next_delay(error)
        if delay is not None:
            return delay, []
        self._refusals += 1
        _log.warning("allocator: the waiting-list reader failed", exc_info=error)
        pause = min(BACKOFF_CAP, BACKOFF_BASE * 2 ** min(self._refusals, 16))
        return _jitter.uniform(pause / 2, pause), self.all_inboxes()

    def succeeded(self) -> None:
        """A round went through."""
        if self.trouble is not None:
            self.trouble = None
            self._refusals = 0
            self._failing_since = None
            self._retrier.succeeded()

    def plan(self) -> tuple[list[tuple[str, list[str]]], list[str]]:
        """This round's acknowledgements (``pick`` key, lease ids) and the
        signal lists to block on."""
        acks = [(s.pool.keys[PICK], list(s.acks)) for s in self._served.values() if s.acks]
        keys = [s.key for s in self._served.values() if s.lids]
        return acks, keys

    def acked(self, acks: list[tuple[str, list[str]]]) -> None:
        """The acknowledgements of ``plan`` reached the server."""
        sent = {pick: set(lids) for pick, lids in acks}
        for served in self._served.values():
            done = sent.get(served.pool.keys[PICK])
            if done:
                served.acks = [lid for lid in served.acks if lid not in done]

    def claimed(self, lid: str) -> None:
        """A release or a renew of lease ``lid`` went through: the server
        claimed its grant itself (lua/prelude_leases.lua, ``P:claim``), so its
        acknowledgement is not sent. A worker that releases within
        :data:`ACK_DELAY` of its grant sends none: its next round is the
        blocking pop alone."""
        for served in self._served.values():
            if lid in served.acks:
                served.acks = [other for other in served.acks if other != lid]

    def route(self, key: Any, message: Any, now: float) -> tuple[Any, Any, Call[Any] | None]:
        """Where a popped message goes: ``(inbox, item, None)`` to put
        ``item`` in its waiter's inbox, ``(None, None, call)`` to release a
        grant whose waiter left (only while nobody claimed it), or
        ``(None, None, None)`` to drop it. A delivered grant is acknowledged
        in the next round. ``now``: the monotonic time it was popped."""
        served = self._served.get(_decode(key))
        if served is None:
            return None, None, None
        pool = served.pool
        text = _decode(message)
        lid = target(text)
        grant = text.startswith(GRANT)
        # A lease of acquire_many goes to the waiter of its request.
        entry = self._waiters.get(lid) or self._waiters.get(request_of(lid))
        if entry is not None and entry[0] is served:
            if grant and self._silent(now) > silence(served.cid):
                # Popped before a silence past the liveness window: the grant
                # may have been taken back since. The waiter asks (a poll
                # hands it over if it is still its own).
                return entry[1], RECHECK, None
            if grant:
                self._remember(served, lid)
            elif text.startswith(DELETED):
                # Its pool was deleted: no more heartbeats for this waiter,
                # which would make the pool's keys again before it leaves.
                served.lids.pop(lid, None)
            return entry[1], message, None
        if grant:
            if lid in self._recent:
                # Delivered already: this is a copy put back after a lost
                # reply. Acknowledge it again; never release it.
                served.acks.append(lid)
                return None, None, None
            return None, None, pool.release_message(text)
        return None, None, None

    def _silent(self, now: float) -> float:
        return 0.0 if self._last_beat is None else now - self._last_beat

    # -- the loop -------------------------------------------------------------

    def rounds(self, clock: Callable[[], float]) -> Generator[ReaderStep, Any, None]:
        """A reader's loop, for both shells: it yields each step for the
        shell to carry out (its thread or task, its connection) and is sent
        the step's result, or thrown the error of a Beat, an Exchange or a
        release. It ends when nothing is left to wait for or acknowledge.
        The sync shell holds its lock while the loop runs, and not while a
        step is carried out. ``clock``: monotonic seconds."""
        while not self.idle:
            try:
                if self.beat_in(clock()) <= 0:
                    results = yield Beat(self.beats())
                    inboxes, again, resubscribe = self.beaten(clock(), results)
                    if resubscribe:
                        yield Subscribe(self.presences.channels())
                    if inboxes:
                        yield Deliver([(inbox, RECHECK) for inbox in inboxes], [])
                    if again:
                        continue
                acks, keys = self.plan()
                popped = yield Exchange(acks, keys, max(0.01, self.beat_in(clock())))
                self.succeeded()
                self.acked(acks)
                now = clock()
                items: list[tuple[Any, Any]] = []
                releases: list[Call[Any]] = []
                for key, message in popped:
                    inbox, item, release = self.route(key, message, now)
                    if inbox is not None:
                        items.append((inbox, item))
                    elif release is not None:
                        releases.append(release)
                if items or releases:
                    yield Deliver(items, releases)
            except Exception as exc:
                error: Exception | None = exc
                # An error thrown in at the pause, or at the Deliver before
                # it, is taken as the first was: no yield of the rounds is
                # outside a try, so no error ends them for every waiter.
                while error is not None:
                    if self.idle:  # its client was closed under it, say
                        return
                    pause, inboxes = self.failed(error)
                    try:
                        if inboxes:
                            yield Deliver([(inbox, RECHECK) for inbox in inboxes], [])
                        yield Sleep(pause)
                        error = None
                    except Exception as again:
                        error = again

    def _remember(self, served: _Served, lid: str) -> None:
        served.acks.append(lid)
        self._recent[lid] = None
        if len(self._recent) > RECENT:
            self._recent.popitem(last=False)


#: A heartbeat's news: the pool's epoch, whether the probed waiter's ticket
#: is in the queue, whether dead tickets are left at the head, the
#: client's presence there (1 connected, 0 not: subscribe again, -1 none),
#: and in how many seconds the head's absent client counts as gone (None:
#: the head is not absent).
Beaten = tuple[str, bool, bool, int, float | None]

#: How long after a grace's end (server time) a heartbeat told of it comes.
DUE_SLACK = 0.02


def heartbeat(pool: Pool, cid: str, probe: str) -> Call[Beaten]:
    """The client-level poll of a reader: keeps all of client ``cid``'s
    waiters in ``pool`` alive, and returns what :data:`Beaten` says."""

    def parse(reply: Any) -> Beaten:
        tag, rest = _tagged("poll", reply)
        if tag != "alive" or len(rest) != 5:
            raise _unexpected("poll", reply)
        due = int(rest[4])
        return (
            _decode(rest[0]),
            int(rest[1]) == 1,
            int(rest[2]) == 1,
            int(rest[3]),
            None if due < 0 else due / 1000,
        )

    return Call("poll", pool.keys, ("", cid, alive_ms(cid), probe), parse)


def recheck_after_beat(epoch: str, previous: str | None, probe_ok: bool, too_long: bool) -> bool:
    """After a reader's heartbeat: must every local waiter check its ticket?

    Yes if the pool's epoch changed (its data was lost), if the probed
    waiter's ticket vanished (the stream was deleted, a restart lost
    it), or if the reader was silent ``too_long``, past the client's
    liveness window (it may have been taken for dead and its tickets
    dropped).
    """
    changed = previous is not None and epoch != previous
    return changed or not probe_ok or too_long


#: How long acknowledgements that no waiter is left to send wait for the
#: next waiter's round to carry them, before the reader's thread (or task)
#: sends them: far within the pick-up check's 2 s, after which a grant not
#: acknowledged goes back on its list (lua/prelude_defaults.lua, PICKUP_MS).
ACK_DELAY = 0.2

#: How much longer than its blocking time a reader waits for its round's
#: reply before it takes the connection for dead (a lost reply costs no
#: grant: one not acknowledged is put back on its list, see lua/prelude_maintenance.lua).
READ_SLACK = 5.0


def round_commands(
    acks: list[tuple[str, list[str]]], keys: list[str], block: float, multipop: bool = True
) -> list[tuple[str | int, ...]]:
    """The commands of a reader's round (see :class:`Reader`), for one pipeline:
    the acknowledgements, then one ``BLMPOP`` that blocks and pops up to
    :data:`BATCH` messages of the first list that has any (Redis >= 7,
    Valkey), or, where the server has no ``BLMPOP`` (``multipop`` False:
    Redis 6.2), a ``BLPOP`` and an ``LPOP`` per list."""
    commands: list[tuple[str | int, ...]] = [("ZREM", pick, *lids) for pick, lids in acks]
    if keys and multipop:
        commands.append(("BLMPOP", f"{block:.3f}", len(keys), *keys, "LEFT", "COUNT", BATCH))
    elif keys:
        commands.append(("BLPOP", *keys, f"{block:.3f}"))
        commands += [("LPOP", key, BATCH) for key in keys]
    return commands


def multipop_refused(commands: list[tuple[str | int, ...]], replies: list[Any]) -> bool:
    """Whether the server refused the round's ``BLMPOP``: a command it does
    not know (Redis 6.2), or one the user's ACL does not grant (written for
    0.3, whose rounds were ``BLPOP`` and ``LPOP``): the reader sends
    ``BLPOP`` rounds from then on."""
    for command, reply in zip(commands, replies, strict=False):
        if command[0] == "BLMPOP" and isinstance(reply, Exception):
            text = str(reply).lower()
            return "unknown command" in text or ("permission" in text and "blmpop" in text)
    return False


def round_replies(
    commands: list[tuple[str | int, ...]], replies: list[Any]
) -> list[tuple[Any, Any]]:
    """The messages a round popped, as ``(key, message)`` pairs in order.
    An error reply (after all replies were read) is raised; on a cluster,
    a MOVED or ASK one as a transient error (:func:`check_slot`)."""
    check_slot(replies)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    at = next((i for i, c in enumerate(commands) if c[0] in ("BLPOP", "BLMPOP")), None)
    if at is None:
        return []
    if commands[at][0] == "BLMPOP":
        # [key, [message, ...]], or nil when it timed out.
        reply = replies[at]
        return popped(None, [(reply[0], reply[1])] if reply else [])
    keys = [c[1] for c in commands[at + 1 :]]
    return popped(replies[at], list(zip(keys, replies[at + 1 :], strict=True)))


def popped(first: Any, rest: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """A BLPOP reply (``[key, message]`` or None) and the LPOP replies after
    it (``(key, [message, ...] or None)``), as ``(key, message)`` pairs.

    Every message popped is kept, whatever the BLPOP answered: when it
    timed out and a grant was pushed before the LPOP ran (a ``CLIENT
    PAUSE`` holds the LPOP while the BLPOP times out), the LPOP popped that
    grant, and dropping it lost the waiter its turn (its lease came 2 s
    late, or, with a ttl of 2 s or less, went to later requesters)."""
    out = [(first[0], first[1])] if first else []
    for key, messages in rest:
        out += [(key, message) for message in messages or ()]
    return out
