-- acquire: join the queue; be granted at once if nobody is ahead and a
-- resource is free (the uncontended case is this one script run).
--
-- KEYS: the pool's keys (lua/README.md), then KEYS[17] the caller's signal key.
-- ARGV: lid, cid, ttl_ms, alive_ms, blocking ('1' | '0'), bind ('' for none),
--       bind_ttl_ms, owner (who holds the lease, for people: kept in the
--       ticket's field `o`)
-- Reply: {'granted', ticket, token, granted_us, deadline_ms, ttl_ms, resource}
--      | {'queued', ticket, hint_ms}   hint_ms: when to look again, -1 for no hint
--      | {'busy'}                      non-blocking, and it could not be granted now
local lid, cid, ttl, alive_ms, blocking, bind, bind_ttl, owner =
  ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5], ARGV[6], ARGV[7], ARGV[8]

-- A retried call whose first reply was lost finds its own ticket here,
-- instead of queueing a second time.
local L, raw = P:lease_load(lid)
if L then
  P:claim(lid, L, P.OWN)
  return P.lease_reply(L)
end
local ticket = raw and string.sub(raw, 3)
-- A waiting record whose ticket left the stream (the stream was deleted):
-- queue again.
if ticket and not redis.call('XRANGE', P.Q, ticket, ticket)[1] then
  redis.call('HDEL', P.RECS, lid)
  ticket = nil
end

P:maintain()

local serve = true
if not ticket then
  local ahead = P:waiting() > 0
  if blocking == '0' then
    -- Serve those already waiting first; take a resource only if none is
    -- left waiting afterwards: a non-blocking call never passes anybody.
    if ahead then
      P:dispatch(nil)
      ahead = P:waiting() > 0
    end
    if ahead or redis.call('ZCARD', P.FREE) == 0 then
      return {'busy'}
    end
  end
  if bind == '' then
    ticket = redis.call('XADD', P.Q, '*', 'l', lid, 'c', cid, 't', ttl, 'o', owner)
  else
    ticket = redis.call('XADD', P.Q, '*', 'l', lid, 'c', cid, 't', ttl, 'o', owner, 'b', bind,
      'B', bind_ttl)
  end
  local best = redis.call('ZRANGE', P.FREE, '0', '0')[1]
  if not ahead and best then
    -- Nobody waits: the caller is the head. The uncontended case ends here.
    local t = {id = ticket, l = lid, c = cid, t = ttl, B = bind_ttl}
    if bind ~= '' then
      t.b = bind
    end
    return P.lease_reply(P:grant(t, best, lid))
  end
  if not best then
    -- Nothing is free, so there is nobody to serve. Others wait: the
    -- caller just joins the line (only the head is ever told anything; a
    -- release serves the queue). Nobody waits: the caller is the head, and
    -- only learns when to look again (what dispatch would find, without
    -- looking at the queue and the free set again).
    if not ahead then
      P:hint({id = ticket, l = lid, c = cid}, lid)
    end
    serve = false
  end
end

-- Those ahead are served first, in order; if resources remain, so are we.
if serve then
  L = P:dispatch(lid)
  if L then
    return P.lease_reply(L)
  end
end
redis.call('HSET', P.RECS, lid, 'W|' .. ticket)
redis.call('ZADD', P.ALIVE, P.now + alive_ms, cid)
return {'queued', ticket, P.self_hint or -1}
