"""The clocks of liveness: how often a client's reader refreshes its
waiters' liveness mark, how long a silent client keeps its place, and how
its presence (docs/concepts.md, 'Liveness marks, presence and dead
waiters') tells a dead process from a stalled one. (The scripts keep the
other side of these rules: PICKUP_MS and GRACE_MS in
lua/prelude_defaults.lua, the marks in lua/prelude_clients.lua.)

A client that keeps a presence holds one connection subscribed to a channel
named by its id under each pool it waits in (``<pool>:p:<client id>``), and
its id starts with :data:`PRESENT`. The scripts count the channel's
subscribers (``PUBSUB SHARDNUMSUB``): a process that dies has its sockets
closed by its kernel, so it is found absent at once and is gone after
:data:`GRACE`; one that is stopped or stalled keeps its connections, and so
its place, until its mark runs out, :data:`ALIVE_PRESENT` after its last
heartbeat. A client without a presence (the server or the ACL cannot count
subscribers, a cluster, fakeredis) is judged by its mark alone, which runs
out :data:`ALIVE` after its last heartbeat, as in 0.2."""

from __future__ import annotations

from .retry import RETRY_BUDGET

#: Longest a client's reader blocks on its signal list before it refreshes
#: the client's liveness mark (a poll that also serves the queue), for a
#: client judged by its mark alone.
HEARTBEAT = 1.0
#: The same for a client that keeps a presence: its connection answers for
#: it (a dead one is found by its presence, and every release looks at the
#: queue head), so its reader refreshes the mark rarely: waiting then costs
#: its process about 2 commands per heartbeat (the heartbeat and one
#: blocking read), under one a second. No longer, so that a live waiter
#: behind a crowd of dead ones, which only its heartbeat finds, is served
#: within 2.5 s of their death. The reader waits for a blocking
#: read's reply itself, so this may exceed the client's socket timeout.
HEARTBEAT_PRESENT = 2.0
#: The longest silence a client's reader may keep (a stalled event loop, a
#: C call holding the GIL, a paused process) without its waiters losing
#: their place or a grant pushed to them. Each refresh marks the client
#: alive for ALIVE plus one heartbeat, the longest gap between refreshes.
#: Past that, the client counts as gone: its tickets are dropped from the
#: queue and grants it has not acknowledged are taken back.
ALIVE = 4.0

#: The same silence for a client that keeps a presence: a dead one is told
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
#: The first characters of the id of a client that keeps a presence.
PRESENT = "p."

#: The liveness mark a refresh sets, in ms (see ALIVE).
ALIVE_MS = round((ALIVE + HEARTBEAT) * 1000)
#: The same for a client that keeps a presence.
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


#: How long a reader with nobody left waiting keeps retrying the
#: acknowledgements it could not send: past the liveness mark and one
#: pick-up check (PICKUP_MS in lua/prelude_defaults.lua), the server has taken back every
#: grant that was not acknowledged, so the acknowledgement no longer matters
#: and the reader ends instead of retrying a gone server for ever.
ACK_GIVE_UP = ALIVE_MS / 1000 + 2.0
