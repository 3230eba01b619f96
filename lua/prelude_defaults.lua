-- @helpers: above, the state of one call; below, the helpers. As a script
-- (EVALSHA) all of it runs on every call; in the Functions library
-- (allocator/_scripts.py) the helpers are defined once, when the library
-- loads, and each call only builds its state, which finds them through a
-- metatable. So the helpers keep no state of their own: only `self`.

-- Constants, and the defaults of the state a run sets as it goes (in the
-- Functions library these are the helpers' own, found through the
-- metatable until a run sets its own value).
-- A grant pushed to a waiter's signal list is checked this long after, and
-- again as long as its client's reader has not acknowledged it: while the
-- client is alive, the grant is put back on its list if a lost reply took
-- it; once the client's liveness has run out, the grant is taken back.
P.PICKUP_MS = 2000
-- A client that keeps a presence (its id starts with 'p.': a connection
-- subscribed to its channel, lua/README.md) and that a run has found
-- absent, no subscriber on that channel, is gone this long after it was
-- first found so: long enough for a reconnect (a restart or a failover
-- drops every connection at once), short enough that a dead waiter holds
-- nobody up for long. GRACE in allocator/_core/presence.py.
P.GRACE_MS = 1000
-- A lease whose holder asked for it to end when its process is gone
-- (`reclaim_on_disconnect`: its ticket has the field `e`, and its client
-- keeps a presence) has its holder's presence checked this often, by a
-- PICK entry `c|<lease id>` (P:check_holder).
P.CHECK_MS = 500
-- Dead tickets dropped from the head of the queue per script run, so that
-- a crowd of dead waiters never blocks the server (200 drops take about
-- 3 ms on Redis 7.0); whoever runs next goes on (a waiter's reply says
-- "look again now", a reader beats again at once).
P.DROP_LIMIT = 200
-- Clients whose presence a run checks, beyond the one it found absent, so
-- that a crowd that died together (a node lost, a rolling restart) has its
-- graces run together instead of one after another as each reaches the
-- head (P:sweep). Each check is one PUBSUB call (~5k instructions).
P.SWEEP = 128
-- Hints are pushed only for events this close; a waiter looks again by
-- itself at least this often (its reader's heartbeat: HEARTBEAT_PRESENT in
-- allocator/_core/presence.py), so a later event is met then, at no cost to
-- the grant path.
P.HORIZON_MS = 2000
-- Expired leases and ended quarantines handled per pass on a hot path;
-- gc() loops until everything due is handled.
P.BATCH = 64
-- The MAXLEN of an XADD that keeps every entry (acquire.lua: a ticket that
-- waits; MAXLEN 0 for one granted in the same run).
P.NO_TRIM = '9223372036854775807'
-- The suffixes of the pool's keys, in the order of lua/README.md ("Keys")
-- and of KEY_SUFFIXES (allocator/_core/keys.py): P:pool_keys.
P.SUFFIXES = {'meta', 'res', 'gone', 'free', 'park', 'q', 'recs', 'exp', 'bind', 'bexp', 'alive',
  'rlog', 'pick', 'held', 'stats', 'events', 'tw', 'tq', 'tenants'}
-- Counters of this run, reported by gc(); `more`: dispatch stopped at
-- DROP_LIMIT with dead tickets left at the head.
P.reclaimed, P.dropped, P.more = 0, 0, false
-- META, read by P:meta (`got_meta` false: not yet); the hint last given
-- ({tag, key, msg}; false: not read yet, P:hints; NO_HINT: none, never
-- changed in place); the caller's own hint (P:hint); the time as hex
-- (P:now_stamp).
P.got_meta, P.nd, P.nh, P.hinted, P.self_hint, P.stamp = false, false, 0, false, false, false
P.NO_HINT, P.hint_tag = {false, false, false}, false
-- Resource record text -> its `rv` (P:counts); [1]: how many it holds.
P.RV_OF = {0}
-- Lease record text -> the lease it holds (P:lease_load, P:lease_save),
-- resource record text -> the record (P:res_load, P:res_save); [1]: how
-- many each holds. A table only in the Functions library, which keeps it
-- across calls (allocator/_scripts.py, library_text); false as a script,
-- where nothing outlives a call.
P.LEASE_OF, P.RES_OF = false, false
-- META's `nd` or `nh` text -> the time it holds, as P:read_times reads it;
-- [1]: how many. The Functions library's only, as LEASE_OF.
P.TIME_OF = false
-- The length of the pool's event log (META `ev`), false while it is off.
P.ev = false
-- The pool's order (META `ord`, prelude_tenants.lua): false for `fifo`, 't'
-- for `tenant`; 'b' while the tenant index is being built, 'f' back under
-- `fifo` until it empties (both served in queue order).
P.ord = false
-- A released resource kept aside for the queue head (P:settle); whether
-- FREE was found empty in this run and nothing entered it since (P:serve,
-- P:place): a grant of the resource kept aside adds nothing to FREE, so
-- the dispatch that made it need not look at FREE again.
P.spare, P.none_free = false, false
-- Set by a reader's heartbeat: dispatch looks at the head even when
-- nothing is free, so that a dead head's grace starts at once.
P.look = false
-- Set once a run has swept the clients' presences (P:sweep); `due`: the
-- end of the grace of an absent head this run met (P:serve), which a
-- reader's heartbeat is told to look again at.
P.swept, P.due = false, false
-- The end of the grace of the absent client being granted (P:serve): its
-- grant's pick-up check comes then (P:grant, P:grant_many).
P.pick_at = false
-- The earliest presence check of a holder this run scheduled
-- (P:check_holder), which the head of the queue is told to look again for
-- (P:maintain keeps it in `nh`).
P.wake = 1e15
