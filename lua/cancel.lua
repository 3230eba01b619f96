-- cancel: a waiter gives up (timeout, task cancellation, KeyboardInterrupt).
-- It leaves the queue; a grant that raced in is ended and passed on to the
-- next waiter in this same run, so that nothing leaks.
--
-- KEYS: the pool's META (lua/README.md, "Keys").
-- ARGV: lid, count (a waiter of acquire_many: how many resources it asked
--       for; its leases are `<lid>.<i>` besides lid, its place-holder
--       entries follow its ticket)
-- Reply: {'cancelled'} left the queue | {'released'} a raced grant was passed on
--      | {'gone'} nothing to do (already cancelled, or never queued)
-- Errors: ALLOCATOR-ARG (a bad argument: nothing written), ALLOCATOR-CORRUPT
--         (the record of this lease id is damaged: nothing written)
local lid, n = ARGV[1], ARGV[2] or '1'
local bad = P:arg('cancel', 'lid', lid, 'text', 128) or
  P:arg('cancel', 'count', n, 'int', 1, 1000)
if bad then
  return bad
end
n = tonumber(n)
local L, raw, damaged = P:lease_load(lid)
if damaged then
  return P:corrupt_lease(lid)
end

P:maintain()
local out = 'gone'
-- A multi grant that raced in: every lease of it ends, so that nothing is
-- left behind (the first one below).
for i = 2, n do
  local id = P.many_id(lid, i)
  local Li = P:lease_load(id)
  if Li then
    P:end_and_settle(id, Li)
    P:event('release', Li.res, Li.token, Li.cid)
    out = 'released'
  end
end
L, raw = P:lease_load(lid)
if L then
  -- end_lease also takes the grant message off the list if it is unread.
  P:end_and_settle(lid, L)
  P:event('release', L.res, L.token, L.cid)
  out = 'released'
elseif raw then
  local ticket = string.sub(raw, 3)
  if n > 1 then
    -- The place-holders right behind the ticket go with it.
    local rest = redis.call('XRANGE', P.Q, '(' .. ticket, '+', 'COUNT', n - 1)
    for i, e in ipairs(rest) do
      if P.ticket_of(e).l ~= P.many_id(lid, i + 1) then
        break
      end
      redis.call('XDEL', P.Q, e[1])
      P:extras(-1)
    end
  end
  if P.ord then
    -- (tenant order) out of its tenant's line too (the ticket names it).
    P:tenant_line('leave', nil, ticket)
  end
  redis.call('XDEL', P.Q, ticket)
  redis.call('HDEL', P.RECS, lid)
  P:unhint(lid)
  out = 'cancelled'
end
if out ~= 'gone' then
  -- An acquire that gave up (timeout, cancellation, interrupt).
  P:note('timeouts', 1)
end
P:dispatch(nil)
return {out}
