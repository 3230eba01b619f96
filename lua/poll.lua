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

redis.call('ZADD', P.ALIVE, P.now + alive_ms, cid)
P:maintain()

if lid == '' then
  P:dispatch(nil)
  -- The epoch changes only when the pool's state was lost (a restart without
  -- persistence, a flush): the router then has every waiter check its ticket.
  redis.call('HSETNX', P.META, 'epoch', P.now_s)
  return {'alive', redis.call('HGET', P.META, 'epoch')}
end

local mine = P:dispatch(lid)
if mine then
  return P.lease_reply(mine)
end
local L, raw = P:lease_load(lid)
if L then
  -- Granted by an earlier push: hand it over in this reply, and take the
  -- message back so that it is not seen twice.
  if L.pickup == '1' then
    redis.call('LREM', KEYS[14], 1, P.grant_msg(lid, L))
    L.pickup = '0'
    P:lease_save(lid, L)
    P:schedule(P.EXP, L.deadline, lid)
  end
  return P.lease_reply(L)
elseif raw then
  return {'queued', string.sub(raw, 3), P.self_hint or -1}
end
return {'gone'}
