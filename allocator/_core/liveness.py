"""The clocks of liveness: how often a client's reader refreshes its
waiters' liveness mark, and how long a silent client keeps its place
(docs/concepts.md, 'Liveness marks, presence and dead waiters'). These are
the clocks of a client judged by its mark alone; one that keeps a presence
has its own (:mod:`.presence`). (The scripts keep the other side of these
rules: PICKUP_MS in lua/prelude_defaults.lua, the marks in
lua/prelude_clients.lua.)"""

from __future__ import annotations

#: Longest a client's reader blocks on its signal list before it refreshes
#: the client's liveness mark (a poll that also serves the queue), for a
#: client judged by its mark alone.
HEARTBEAT = 1.0
#: The longest silence a client's reader may keep (a stalled event loop, a
#: C call holding the GIL, a paused process) without its waiters losing
#: their place or a grant pushed to them. Each refresh marks the client
#: alive for ALIVE plus one heartbeat, the longest gap between refreshes.
#: Past that, the client counts as gone: its tickets are dropped from the
#: queue and grants it has not acknowledged are taken back.
ALIVE = 4.0
#: The liveness mark a refresh sets, in ms (see ALIVE).
ALIVE_MS = round((ALIVE + HEARTBEAT) * 1000)

#: How long a reader with nobody left waiting keeps retrying the
#: acknowledgements it could not send: past the liveness mark and one
#: pick-up check (PICKUP_MS in lua/prelude_defaults.lua), the server has taken back every
#: grant that was not acknowledged, so the acknowledgement no longer matters
#: and the reader ends instead of retrying a gone server for ever.
ACK_GIVE_UP = ALIVE_MS / 1000 + 2.0
