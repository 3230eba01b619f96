-- gc: one bounded step of garbage collection; the client calls it again with
-- the returned cursors until both are done and nothing is left due. Safe to
-- run from any number of processes at once: every step is one atomic run.
--
-- 1. leases past their deadline: those due in `exp`, and every pending ticket
--    of the group, found page by page with XAUTOCLAIM (its reply has two
--    elements on Redis 6.2 and three on 7.0; the claim resets the entry's
--    idle time, which nothing here relies on: each lease's own deadline on
--    the server clock decides);
-- 2. queue entries of waiters that are gone, page by page through the
--    waiting part of the queue (after `ld`: the cursor never goes back into
--    granted tickets, however far the queue moved between two steps);
-- 3. bindings past their ttl; liveness marks that ran out, with the signal
--    lists and the absence records of those clients;
-- 4. repair: page by page through the resources, a lease count that
--    disagrees with the index of live leases is set right;
-- 5. then the queue is served.
--
-- ARGV: pel_cursor ('0-0' to start), queue_cursor ('' to start),
--       res_cursor ('0' to start, '' to skip), count
-- Reply: {'gc', reclaimed, dropped_waiters, expired_bindings, unparked,
--         orphans, repaired, next_pel_cursor ('0-0': done),
--         next_queue_cursor ('': done), next_res_cursor ('': done),
--         more (1: something due was left for the next step)}
local pel_cursor, q_cursor, res_cursor, count = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local more = 0
local orphans = 0
local repaired = 0

-- gc runs the maintenance pass whatever `nd` says (and so repairs it).
P:meta()
P.nd = 0
local reclaimed_now, unparked = P:maintain(count)
if reclaimed_now >= count or unparked >= count then
  more = 1
end

-- 1. The pending list: every granted ticket, whatever EXP says about it.
local claimed = redis.pcall('XAUTOCLAIM', P.Q, 'g', 'd', 0, pel_cursor, 'COUNT', count, 'JUSTID')
local next_pel = '0-0'
-- No group yet (nothing was ever granted) means nothing is pending; any
-- other error (an ACL without XAUTOCLAIM, say) is the caller's to see.
if claimed.err and not string.find(tostring(claimed.err), 'NOGROUP', 1, true) then
  return redis.error_reply(tostring(claimed.err))
end
if not claimed.err then
  local before = P.reclaimed
  next_pel = claimed[1]
  for _, id in ipairs(claimed[2]) do
    local e = redis.call('XRANGE', P.Q, id, id)[1]
    local t = e and P.ticket_of(e)
    local L, raw = nil, nil
    if t and t.l then
      L, raw = P:lease_load(t.l)
    end
    if L and L.ticket == id then
      if L.deadline <= P.now or not P.counted(L, P:res_load(L.res)) then
        P:end_and_settle(t.l, L)
        P.reclaimed = P.reclaimed + 1
      end
    elseif raw and string.sub(raw, 3) == id then
      -- A waiting ticket that the group delivered without a grant (the group
      -- was moved by hand): ack it; it keeps its place in the queue.
      redis.call('XACK', P.Q, 'g', id)
    else
      -- Pending with no lease behind it: a leftover, acked and deleted.
      redis.call('XACK', P.Q, 'g', id)
      redis.call('XDEL', P.Q, id)
      orphans = orphans + 1
    end
  end
  P:note('reclaimed', P.reclaimed - before)
  -- Redis 7 also lists pending ids whose entries were deleted (and drops them).
  if claimed[3] then
    orphans = orphans + #claimed[3]
  end
end

-- 2. Waiters that are gone, anywhere in the queue (dispatch drops them only
-- when they reach the head). Tickets up to `ld` are granted: the walk
-- starts after it, or after the cursor if that is further on; drop() itself
-- leaves any ticket that is not waiting alone.
P:meta()
local from = P.ld
if q_cursor ~= '' and P.id_after(q_cursor, from) then
  from = q_cursor
end
local next_q = ''
local entries = redis.call('XRANGE', P.Q, '(' .. from, '+', 'COUNT', count)
for _, e in ipairs(entries) do
  local t = P.ticket_of(e)
  if t.c and not P:alive(t.c) then
    P:drop(t)
  end
end
if #entries >= count then
  next_q = entries[#entries][1]
end

-- 3. Bindings past their ttl, and liveness marks that ran out.
local expired = redis.call('ZRANGEBYSCORE', P.BEXP, '-inf', P.now, 'LIMIT', '0', count)
for _, name in ipairs(expired) do
  redis.call('HDEL', P.BIND, name)
  redis.call('ZREM', P.BEXP, name)
end
if #expired >= count then
  more = 1
end
local gone = redis.call('ZRANGEBYSCORE', P.ALIVE, '-inf', '(' .. P.now, 'LIMIT', '0', count)
for _, cid in ipairs(gone) do
  redis.call('DEL', P.SIG .. cid)
  redis.call('ZREM', P.ALIVE, cid)
  redis.call('HDEL', P.RECS, 'p|' .. cid)
end
if #gone >= count then
  more = 1
end

-- 4. Every resource's `used` must equal its entries in the index of live
-- leases (void leases are not in it). Anything else is a bug's trace; set
-- it right, so that no resource stays full, or over-granted, for ever.
local next_res = ''
if res_cursor ~= '' then
  local page = redis.call('HSCAN', P.RES, res_cursor, 'COUNT', count)
  for i = 1, #page[2], 2 do
    local name = page[2][i]
    local r = P:res_load(name)
    local live = redis.call('ZLEXCOUNT', P.HELD, '[' .. name .. '\0', '(' .. name .. '\1')
    if r and r.used ~= live then
      r.used = live
      if r.state == 'd' and live <= 0 then
        P:retire(name, r)
      else
        -- Placed anew, whatever FREE held for it.
        P:place(name, r, true)
        P:res_save(name, r)
      end
      repaired = repaired + 1
    end
  end
  if page[1] ~= '0' then
    next_res = page[1]
  end
end

-- 5. Serve whoever can be served now.
P:dispatch(nil)
-- The count of waiting place-holders (status only) is set right whenever
-- nobody waits: a stream deleted under waiting multi requests left it high.
if P:waiting() <= 0 and redis.call('HGET', P.META, 'xw') then
  redis.call('HDEL', P.META, 'xw')
end
if P.more then
  more = 1
end
return {'gc', P.reclaimed, P.dropped, #expired, unparked, orphans, repaired, next_pel, next_q,
        next_res, more}
