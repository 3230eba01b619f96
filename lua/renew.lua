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

-- Of META, only `nd` and `nh`: while nothing comes due, a renew needs no
-- more.
local reclaimed, unparked = P:maintain(nil, true)
local L, _, damaged = P:lease_load(lid)
if damaged then
  return P:corrupt_lease(lid)
end
if not L or L.ticket ~= ticket then
  P:dispatch(nil)
  return {'lost'}
end
if L.deadline <= P.now or not P:counts(L) then
  P:end_and_settle(lid, L)
  if L.deadline <= P.now then
    P:event('expire', L.res, L.token, L.cid)
  end
  P:dispatch(nil)
  return {'lost'}
end
L.deadline = P.now + ttl
local dl = P.istr(L.deadline)
-- Renewing, the holder shows it has the grant.
if L.pickup == '1' then
  P:claim(lid, L, P.SIG .. L.cid)
end
P:lease_save(lid, L, dl)
P:schedule(P.EXP, L.deadline, lid, dl)
-- A renew frees nothing: the queue is served only if maintenance did
-- (else whoever waits was told when to look again by the run that left
-- it waiting).
if reclaimed + unparked > 0 then
  P:dispatch(nil)
end
return {'renewed', L.deadline}
