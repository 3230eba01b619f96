-- poll: a waiter's heartbeat. Refreshes the client's liveness mark, handles
-- what came due (expired leases, ended quarantines), serves the queue, and
-- tells the caller where its ticket stands. Called when a waiter's blocking
-- read times out, when its hint comes due, and (with lid '') by the asyncio
-- router once per interval for all waiters of its client.
--
-- KEYS: the pool's keys, then KEYS[14] the caller's signal key.
-- ARGV: lid ('' for a client-level heartbeat), cid, alive_ms
-- Reply: {'granted', ticket, token, granted_us, deadline_ms, ttl_ms, resource}
--      | {'queued', ticket, hint_ms} | {'gone'}   the ticket is not in the queue
--      | {'alive', epoch}                        client-level heartbeat
local lid, cid, alive_ms = ARGV[1], ARGV[2], tonumber(ARGV[3])

redis.call('ZADD', K_ALIVE, fmt(NOW + alive_ms), cid)
maintain()

if lid == '' then
  dispatch(nil)
  -- The epoch changes only when the pool's state was lost (a restart without
  -- persistence, a flush): the router then has every waiter check its ticket.
  redis.call('HSETNX', K_META, 'epoch', fmt(NOW_US))
  return {'alive', redis.call('HGET', K_META, 'epoch')}
end

local mine = dispatch(lid)
if mine then
  return lease_reply(mine)
end
local L, raw = lease_load(lid)
if L then
  -- Granted by an earlier push: hand it over in this reply, and take the
  -- message back so that it is not seen twice.
  if L.pickup == '1' then
    redis.call('LREM', KEYS[14], 1, grant_msg(lid, L))
    L.pickup = '0'
    lease_save(lid, L)
    redis.call('ZADD', K_EXP, fmt(L.deadline), lid)
  end
  return lease_reply(L)
elseif raw then
  return {'queued', string.sub(raw, 3), fmt(SELF_HINT or -1)}
end
return {'gone'}
