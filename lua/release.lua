-- release: end a lease and hand the slot to the next waiter in the same run.
--
-- ARGV: lid, ticket, quarantine_ms ('' for none)
-- Reply: {'released'} | {'lost'}   the lease had already ended (expired,
--        revoked, released before): nothing was changed on its behalf
local lid, ticket, quarantine = ARGV[1], ARGV[2], ARGV[3]

maintain()
local L = lease_load(lid)
if not L or L.ticket ~= ticket then
  dispatch(nil)
  return {'lost'}
end
local r = end_lease(lid, L)
-- Past its deadline (not yet reclaimed) or void: it was not live any more.
if not r or L.deadline <= NOW then
  if r then
    settle(L.res, r)
  end
  dispatch(nil)
  return {'lost'}
end
if quarantine ~= '' and r.state ~= 'd' then
  local untl = NOW + tonumber(quarantine)
  if r.state == 'q' or r.state == 't' then
    untl = math.max(untl, r.untl)
  end
  park(L.res, r, 'q', untl)
end
settle(L.res, r)
dispatch(nil)
return {'released'}
