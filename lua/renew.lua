-- renew: push a live lease's deadline to now + ttl. Never revives a lease
-- that is past its deadline or void, even if nobody reclaimed it yet.
--
-- ARGV: lid, ticket, ttl_ms
-- Reply: {'renewed', deadline_ms} | {'lost'}
local lid, ticket, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])

P:maintain()
local L = P:lease_load(lid)
if not L or L.ticket ~= ticket then
  P:dispatch(nil)
  return {'lost'}
end
if L.deadline <= P.now or not P.counted(L, P:res_load(L.res)) then
  P:end_and_settle(lid, L)
  P:dispatch(nil)
  return {'lost'}
end
L.deadline = P.now + ttl
-- Renewing, the holder shows it has the grant.
P:claim(lid, L, P.SIG .. L.cid)
P:lease_save(lid, L)
P:schedule(P.EXP, L.deadline, lid)
P:dispatch(nil)
return {'renewed', L.deadline}
