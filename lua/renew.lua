-- renew: push a live lease's deadline to now + ttl. Never revives a lease
-- that is past its deadline or void, even if nobody reclaimed it yet.
--
-- ARGV: lid, ticket, ttl_ms
-- Reply: {'renewed', deadline_ms} | {'lost'}
local lid, ticket, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])

maintain()
local L = lease_load(lid)
if not L or L.ticket ~= ticket then
  dispatch(nil)
  return {'lost'}
end
if L.deadline <= NOW or not counted(L, res_load(L.res)) then
  end_and_settle(lid, L)
  dispatch(nil)
  return {'lost'}
end
L.deadline = NOW + ttl
L.pickup = '0'
lease_save(lid, L)
redis.call('ZADD', K_EXP, fmt(L.deadline), lid)
dispatch(nil)
return {'renewed', fmt(L.deadline)}
