-- acquire_many: join the queue for `count` resources at once, all or
-- nothing; be granted at once if nobody is ahead and `count` resources are
-- free. The request is one place in the queue (see P:grant_many in the
-- prelude): at the head it waits until `count` resources are free at once,
-- and those behind it wait too.
--
-- KEYS: the pool's META (lua/README.md, "Keys").
-- ARGV: lid, cid, ttl_ms, alive_ms, blocking ('1' | '0'), count, owner (who
--       holds the leases, for people: the field `o` of every entry of the
--       request, so that leases() shows it for each lease), reclaim (as
--       acquire's: optional, '1' in the field `e` of the request's head),
--       info (as acquire's: optional), tenant (as acquire's: optional, in
--       the field `T` of every entry of the request)
-- Lease ids: lid for the first resource, `<lid>.<i>` for resource i.
-- Reply: {'granted_many', ticket1, token1, granted_us1, deadline_ms1, ttl_ms1, resource1,
--         ticket2, ...}                  count leases, in the order granted
--      | {'queued', ticket, hint_ms}   hint_ms: when to look again, -1 for no hint
--      | {'busy'}                      non-blocking, and it could not be granted now
--      | {'toomany', size}             count is larger than the pool (nothing queued)
-- Errors: ALLOCATOR-ARG (a bad argument: nothing written), ALLOCATOR-CORRUPT
--         (a record of this request is damaged)
local lid, cid, ttl, alive_ms, blocking, n, owner =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local bad = P:arg('acquire_many', 'lid', lid, 'text', 128, '|.') or
  P:arg('acquire_many', 'cid', cid, 'text', 128, '|') or
  P:arg('acquire_many', 'ttl_ms', ttl, 'int', 1, 315360000000) or
  P:arg('acquire_many', 'alive_ms', alive_ms, 'num', 1, 315360000000) or
  P:arg('acquire_many', 'blocking', blocking, 'flag') or
  P:arg('acquire_many', 'count', n, 'int', 1, 1000) or
  P:arg('acquire_many', 'owner', owner, 'text', 200)
if bad then
  return bad
end
n = tonumber(n)
local reclaim = ARGV[8] == '1' and string.sub(cid, 1, 2) == 'p.'
local tenant = ARGV[10] or ''
bad = P:arg('acquire_many', 'tenant', tenant, 'tenant', 200)
if bad then
  return bad
end
if ARGV[9] and ARGV[9] ~= '' then
  bad = P:arg('acquire_many', 'info', ARGV[9], 'text', 512)
  if bad then
    return bad
  end
  P:introduce(cid, ARGV[9], tonumber(alive_ms))
end

-- A retried call whose first reply was lost finds its own grant or ticket
-- here, instead of queueing a second time (a grant that lost some of its
-- leases meanwhile is ended whole, and the request queues again).
local got, raw, damaged = P:many_load(lid, n)
if damaged then
  return P:corrupt_lease(lid)
end
if got then
  for _, g in ipairs(got) do
    P:claim(g[1], g[2])
  end
  return P.many_reply(got)
end
local ticket = raw and string.sub(raw, 3)
if ticket and not redis.call('XRANGE', P.Q, ticket, ticket)[1] then
  redis.call('HDEL', P.RECS, lid)
  ticket = nil
end

P:maintain()

if not ticket then
  -- Checked on the server, against the pool as it is now: a request that
  -- could never be served is refused rather than queued for ever.
  local size = redis.call('HLEN', P.RES)
  if n > size then
    return {'toomany', size}
  end
  if blocking == '0' then
    -- As acquire: serve those already waiting first, and take resources
    -- only if nobody is left waiting and `n` are free.
    local ahead = P:waiting() > 0
    if ahead then
      P:dispatch(nil)
      ahead = P:waiting() > 0
    end
    if ahead or redis.call('ZCARD', P.FREE) < n or not P:free_ok(n) then
      return {'busy'}
    end
  end
  if reclaim then
    -- As acquire's.
    redis.call('HDEL', P.RECS, 'p|' .. cid)
  end
  if tenant ~= '' then
    -- (tenants) as acquire's: the same entries, with their tenant.
    if reclaim then
      ticket = redis.call('XADD', P.Q, '*', 'l', lid, 'c', cid, 't', ttl, 'o', owner, 'n', n,
        'e', '1', 'T', tenant)
    else
      ticket = redis.call('XADD', P.Q, '*', 'l', lid, 'c', cid, 't', ttl, 'o', owner, 'n', n,
        'T', tenant)
    end
    for i = 2, n do
      redis.call('XADD', P.Q, '*', 'l', P.many_id(lid, i), 'c', cid, 'o', owner, 'x', '1',
        'T', tenant)
    end
    redis.call('HSETNX', P.META, 'tu', '1')
  elseif reclaim then
    ticket = redis.call('XADD', P.Q, '*', 'l', lid, 'c', cid, 't', ttl, 'o', owner, 'n', n,
      'e', '1')
  else
    ticket = redis.call('XADD', P.Q, '*', 'l', lid, 'c', cid, 't', ttl, 'o', owner, 'n', n)
  end
  for i = 2, tenant == '' and n or 1 do
    redis.call('XADD', P.Q, '*', 'l', P.many_id(lid, i), 'c', cid, 'o', owner, 'x', '1')
  end
  if n > 1 then
    P:extras(n - 1)
  end
  if P.ord then
    -- (tenant order) it waits: in its tenant's line, before anyone is served.
    P:tenant_line('join', tenant, ticket)
  end
end

-- Those ahead are served first, in order; if enough resources remain, so
-- are we (in this run: all `count` at once).
got = P:dispatch(lid)
if got then
  return P.many_reply(got)
end
redis.call('HSET', P.RECS, lid, 'W|' .. ticket)
local until_ms = P.now + alive_ms
redis.call('ZADD', P.ALIVE, P.istr(until_ms) or until_ms, cid)
return {'queued', ticket, P.self_hint or -1}
