-- revoke: end one lease now (an operator's "this holder must let go"). The
-- resource keeps its capacity, priority and rate, and its slot goes to the
-- next waiter in the same run; the holder learns it at its next renew
-- (`LeaseLost`) or release (False), and its token fences anything it still
-- sends.
--
-- ARGV: lid (the lease's id)
-- Reply: {'revoked'} | {'unknown'}   no live lease has that id (it ended:
--        released, expired, revoked before; or it never was)
-- Errors: ALLOCATOR-ARG (a bad lease id: nothing written), ALLOCATOR-CORRUPT
--         (the record of this lease id is damaged)
local lid = ARGV[1]
local bad = P:arg('revoke', 'lid', lid, 'text', 128)
if bad then
  return bad
end

P:maintain()
local L, _, damaged = P:lease_load(lid)
if damaged then
  return P:corrupt_lease(lid)
end
if not L then
  return {'unknown'}
end
local r = P:end_lease(lid, L)
if not r or L.deadline <= P.now then
  -- Past its deadline (not yet reclaimed) or void: not live any more.
  if r then
    P:settle(L.res, r)
  end
  P:dispatch(nil)
  return {'unknown'}
end
P:note('revoked', 1)
P:event('revoke', L.res, L.token, L.cid)
P:settle(L.res, r)
P:dispatch(nil)
return {'revoked'}
