-- poll: a waiter's heartbeat. Refreshes the client's liveness mark, handles
-- what came due (expired leases, ended quarantines), serves the queue, and
-- tells the caller where its ticket stands. Called by a waiter when its hint
-- comes due or its reader asks it to look, and (with lid '') by the reader
-- once per interval for all waiters of its client.
--
-- KEYS: the pool's META (lua/README.md, "Keys").
-- ARGV: lid ('' for a client-level heartbeat), cid, alive_ms,
--       probe (heartbeat only: a waiter of the client whose ticket to check),
--       count (a waiter of acquire_many: how many resources it asked for)
-- Reply: {'granted', ticket, token, granted_us, deadline_ms, ttl_ms, resource}
--      | {'granted_many', ...}   a waiter of acquire_many (see acquire_many.lua)
--      | {'queued', ticket, hint_ms} | {'gone'}   the ticket is not in the queue
--      | {'alive', epoch, probe_ok, more, present, due_ms}  client-level
--          heartbeat; more: 1 if dead tickets are left at the head (beat
--          again at once); present: for a client that keeps a presence
--          ('p.' ids), 1 if its channel has a subscriber, 0 if not (it must
--          subscribe again), -1 if the server cannot tell; -1 for any other
--          client; due_ms: the head's client is absent and counts as gone
--          in that many ms (beat again then: it and those found absent with
--          it leave the queue), -1 if not
-- Errors: ALLOCATOR-ARG (a bad argument: nothing written), ALLOCATOR-CORRUPT
--         (the record of this lease id is damaged)
local lid, cid, alive_ms, probe, n = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
-- A lease id that is looked up, never written (lid, probe), may be any text
-- Python's checks let through; one that could not be written finds nothing.
local bad = (lid ~= '' and P:arg('poll', 'lid', lid, 'text', 128)) or
  P:arg('poll', 'cid', cid, 'text', 128, '|') or
  P:arg('poll', 'alive_ms', alive_ms, 'num', 1, 315360000000) or
  (probe and probe ~= '' and P:arg('poll', 'probe', probe, 'text', 128)) or
  (n and n ~= '' and P:arg('poll', 'count', n, 'int', 1, 1000))
if bad then
  return bad
end
n = tonumber(n or '')

local until_ms = P.now + alive_ms
redis.call('ZADD', P.ALIVE, P.istr(until_ms) or until_ms, cid)
-- A client that runs its own call lives: whatever absence a run found
-- (its presence connection dropped, and it subscribes again), its grace
-- starts anew.
if string.sub(cid, 1, 2) == 'p.' then
  redis.call('HDEL', P.RECS, 'p|' .. cid)
end
P:maintain()

if lid == '' then
  -- Each heartbeat looks at the head, free resources or not: a head whose
  -- client died is found absent within a heartbeat of its death, and is
  -- dropped when its grace ends (its successor is told to look then).
  P.look = true
  P:dispatch(nil)
  -- The epoch changes only when the pool's state was lost (a restart without
  -- persistence, a flush). The probe is one of the client's waiters, taken in
  -- turn: if its ticket vanished (the stream was deleted, a restart lost it),
  -- the reader has every waiter check its own.
  redis.call('HSETNX', P.META, 'epoch', P.now_s)
  local ok = 1
  if probe and probe ~= '' then
    -- (A damaged record reads as none: the waiter's own look reports it.)
    local L, raw = P:lease_load(probe)
    if not L and not raw then
      ok = 0
    elseif raw and not L then
      local ticket = string.sub(raw, 3)
      if not redis.call('XRANGE', P.Q, ticket, ticket)[1] then
        ok = 0
      end
    end
  end
  -- A damaged epoch reads as '0', the same each time: no reader takes it
  -- for a loss of data on every beat (gc removes it; the next beat sets a
  -- new one, and the readers look once).
  local epoch = redis.call('HGET', P.META, 'epoch')
  if not string.find(epoch, '^%d+$') then
    epoch = '0'
  end
  local due = P.due and math.max(P.due - P.now, 0) or -1
  return {'alive', epoch, ok, P.more and 1 or 0, P:presence_of(cid), due}
end

local mine = P:dispatch(lid)
if mine and n then
  return P.many_reply(mine)
elseif mine then
  return P.lease_reply(mine)
end
local L, raw, got, damaged
if n then
  -- Granted by an earlier push: all of its leases in this reply (or none,
  -- if some were taken back meanwhile: then the request queues again).
  got, raw, damaged = P:many_load(lid, n)
  if got then
    for _, g in ipairs(got) do
      P:claim(g[1], g[2])
    end
    return P.many_reply(got)
  end
else
  L, raw, damaged = P:lease_load(lid)
end
if damaged then
  return P:corrupt_lease(lid)
end
if L then
  -- Granted by an earlier push: hand it over in this reply.
  P:claim(lid, L)
  return P.lease_reply(L)
elseif raw then
  local ticket = string.sub(raw, 3)
  if redis.call('XRANGE', P.Q, ticket, ticket)[1] then
    return {'queued', ticket, P.self_hint or -1}
  end
  -- The ticket left the stream without a grant (the stream was deleted, or
  -- a gc took it for a dead client's): the waiter queues again.
  redis.call('HDEL', P.RECS, lid)
end
return {'gone'}
