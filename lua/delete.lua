-- delete: remove the pool and every key it has. While leases are live or
-- requesters wait, nothing changes unless forced. Forced, each waiter is
-- told `d|<lease id>` on its client's signal list (its acquire raises
-- AcquireTimeout: it must not wait for ever, nor queue again), a grant
-- pushed and not yet taken becomes the same notice, and the holders of
-- live leases find them gone (renew: LeaseLost; release: false) and are
-- told so on their presence channel (P:tell_end).
--
-- ARGV: force ('1' | '0')
-- Reply: {'absent'} | {'busy', leases, waiting} | {'deleted', revoked, waiters}
-- Errors: ALLOCATOR-ARG (a bad argument: nothing written)
local bad = P:arg('delete', 'force', ARGV[1], 'flag')
if bad then
  return bad
end
local force = ARGV[1] == '1'

local keys = P:pool_keys()
if redis.call('EXISTS', unpack(keys)) == 0 then
  return {'absent'}
end
P:maintain()
local leases, waiting = redis.call('ZCARD', P.EXP), P:waiting()
if not force and (leases > 0 or waiting > 0) then
  return {'busy', leases, waiting}
end

local revoked, waiters = 0, 0
local recs = redis.call('HGETALL', P.RECS)
for i = 1, #recs, 2 do
  local lid = recs[i]
  -- (A damaged record is neither: it goes with the keys.)
  local L, raw = P:lease_load(lid)
  if L then
    if P:unclaimed(lid, L) then
      -- Its waiter has not taken the grant yet: it gets the notice instead.
      P:claim(lid, L)
      redis.call('RPUSH', P.SIG .. L.cid, 'd|' .. lid)
      waiters = waiters + 1
    else
      P:tell_end(lid, L.cid)
      revoked = revoked + 1
    end
  elseif raw then -- W|ticket: waiting
    local e = redis.call('XRANGE', P.Q, string.sub(raw, 3), string.sub(raw, 3))[1]
    local t = e and P.ticket_of(e)
    if t and t.c then
      redis.call('RPUSH', P.SIG .. t.c, 'd|' .. lid)
      waiters = waiters + 1
    end
  end
end
-- Signal lists of clients that are gone: nobody will pop them.
local marks = redis.call('ZRANGEBYSCORE', P.ALIVE, '-inf', '(' .. P.now)
for _, cid in ipairs(marks) do
  redis.call('DEL', P.SIG .. cid)
end
redis.call('DEL', unpack(keys))
return {'deleted', revoked, waiters}
