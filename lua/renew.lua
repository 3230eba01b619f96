-- renew: push a live lease's deadline to now + ttl. Never revives a lease
-- that is past its deadline or void, even if nobody reclaimed it yet.
--
-- ARGV: lid, ticket, ttl_ms
-- Reply: {'renewed', deadline_ms} | {'lost'}
-- Errors: ALLOCATOR-ARG (a bad argument: nothing written), ALLOCATOR-CORRUPT
--         (the lease's record is damaged)
local lid, ticket, ttl = ARGV[1], ARGV[2], ARGV[3]
-- The common case in one cheap test, then argument by argument (acquire.lua).
if not (lid and ticket and ttl and lid ~= '' and ticket ~= '' and #lid <= 128 and
    #ticket <= 64 and #ttl < 12 and string.find(ttl, '^[1-9]%d*$')) then
  local bad = P:arg('renew', 'lid', lid, 'text', 128) or
    P:arg('renew', 'ticket', ticket, 'text', 64) or
    P:arg('renew', 'ttl_ms', ttl, 'int', 1, 315360000000)
  if bad then
    return bad
  end
end

-- A renew does no maintenance: the calls that free resources do it, and a
-- waiter looks again when a lease comes due (its hint, its heartbeat). So
-- a renew reads nothing of META while its deadline only moves later.
local L, _, damaged = P:lease_load(lid)
if damaged then
  return P:corrupt_lease(lid)
end
if not L or L.ticket ~= ticket then
  return {'lost'}
end
if L.deadline <= P.now or not P:counts(L) then
  -- Past its deadline (not yet reclaimed) or void: it ends here, and the
  -- queue is served.
  P:end_and_settle(lid, L)
  if L.deadline <= P.now then
    P:event('expire', L.res, L.token, L.cid)
  end
  P:dispatch(nil)
  return {'lost'}
end
local was = L.deadline
L.deadline = P.now + ttl
local dl = P.istr(L.deadline)
-- Renewing, the holder shows it has the grant.
if L.pickup == '1' then
  P:claim(lid, L)
end
P:lease_save(lid, L, dl)
if L.deadline >= was then
  -- Later than before: `nd` and `nh`, lower bounds (P:schedule), stay so.
  redis.call('ZADD', P.EXP, dl or L.deadline, lid)
else
  P:schedule(P.EXP, L.deadline, lid, dl)
end
return {'renewed', L.deadline}
