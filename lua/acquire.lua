-- acquire: join the queue; be granted at once if nobody is ahead and a
-- resource is free (the uncontended case is this one script run).
--
-- KEYS: the pool's keys (lua/README.md), then KEYS[14] the caller's signal key.
-- ARGV: lid, cid, mode ('l' | 'c'), ttl_ms, alive_ms, blocking ('1' | '0'),
--       bind ('' for none), bind_ttl_ms
-- Reply: {'granted', ticket, token, granted_us, deadline_ms, ttl_ms, resource}
--      | {'queued', ticket, hint_ms}   hint_ms: when to look again, -1 for no hint
--      | {'busy'}                      non-blocking, and it could not be granted now
local lid, cid, mode, ttl, alive_ms, blocking, bind, bind_ttl =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6], ARGV[7], ARGV[8]

-- A retried call whose first reply was lost finds its own ticket here,
-- instead of queueing a second time.
local L, raw = lease_load(lid)
if L then
  return lease_reply(L)
end
local ticket = raw and string.sub(raw, 3)

maintain()

if not ticket then
  if blocking == '0' then
    -- Serve those already waiting first; take a resource only if none is
    -- left waiting afterwards: a non-blocking call never passes anybody.
    dispatch(nil)
    if waiting() > 0 or redis.call('ZCARD', K_FREE) == 0 then
      return {'busy'}
    end
  end
  local fields = {'l', lid, 'c', cid, 'm', mode, 't', ttl}
  if bind ~= '' then
    fields[9], fields[10], fields[11], fields[12] = 'b', bind, 'B', bind_ttl
  end
  ticket = redis.call('XADD', K_Q, '*', unpack(fields))
end

-- Those ahead are served first, in order; if resources remain, so are we.
L = dispatch(lid)
if L then
  return lease_reply(L)
end
redis.call('HSET', K_RECS, lid, 'W|' .. ticket)
redis.call('ZADD', K_ALIVE, fmt(NOW + alive_ms), cid)
return {'queued', ticket, fmt(SELF_HINT or -1)}
