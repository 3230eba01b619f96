-- revoke: end one lease now (an operator's "this holder must let go"). The
-- resource keeps its capacity, priority and rate, and its slot goes to the
-- next waiter in the same run; the holder learns it at its next renew
-- (`LeaseLost`) or release (False), and its token fences anything it still
-- sends.
--
-- ARGV: lid (the lease's id)
-- Reply: {'revoked'} | {'unknown'}   no live lease has that id (it ended:
--        released, expired, revoked before; or it never was)
local lid = ARGV[1]

P:maintain()
local L = P:lease_load(lid)
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
P:settle(L.res, r)
P:dispatch(nil)
return {'revoked'}
