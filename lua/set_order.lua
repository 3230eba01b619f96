-- set_order: the pool's order, kept with the pool (META `ord`,
-- prelude_tenants.lua): `fifo`, the queue served in arrival order, or
-- `tenant`, fair shares between the tenants the requests name. It changes
-- who is served next, never a grant already made.
--
-- To `tenant`: the index of the waiting tickets is built in bounded steps
-- (`count` tickets of the queue a run, from its start, META `oc` the cursor;
-- META `ord` = 'b' meanwhile: tickets that queue join it at once, and the
-- queue is still served in arrival order); the caller calls again while
-- the reply says 'building'. Where the index is whole already (back under
-- `fifo` a while ago, `ord` = 'f': it is kept until it empties), at once.
-- To `fifo`: at once; the index is kept until it empties (`ord` = 'f').
--
-- ARGV: order ('fifo' | 'tenant'), count (tickets indexed per run, 1 to 1000)
-- Reply: {'order', 'fifo'} | {'order', 'tenant'} | {'order', 'building'}
-- Errors: ALLOCATOR-ARG (a bad argument: nothing written)
local order, count = ARGV[1], ARGV[2]
local bad = (order ~= 'fifo' and order ~= 'tenant' and
    P:bad_arg('set_order', 'order', "must be 'fifo' or 'tenant'", order)) or
  P:arg('set_order', 'count', count, 'int', 1, 1000)
if bad then
  return bad
end

P:maintain()
local tw = P:key('tw')
if order == 'fifo' then
  if P.ord == 't' or P.ord == 'b' then
    P.ord = 'f'
    -- An index with nobody in it goes at once (else with its last waiter,
    -- P:tenant_line).
    if redis.call('EXISTS', tw) == 0 then
      redis.call('DEL', P:key('tq'))
      redis.call('HDEL', P.META, 'oc')
      P.ord = false
    end
    P:tenant_save()
  end
  return {'order', 'fifo'}
end

if P.ord == 't' then
  return {'order', 'tenant'}
end
local from = redis.call('HGET', P.META, 'oc')
if P.ord == 'f' and not from then
  -- The index was kept whole: the order changes at once.
  P.ord = 't'
  P:tenant_save()
  P:dispatch(nil)
  return {'order', 'tenant'}
end
if not P.ord or not (from and P.is_id(from)) then
  -- A build starts (again) at the start of the queue.
  from = '0-0'
end
if P.ord ~= 'b' then
  P.ord = 'b'
  P:tenant_save()
end
local n = tonumber(count)
local entries = redis.call('XRANGE', P.Q, '(' .. from, '+', 'COUNT', n)
for _, e in ipairs(entries) do
  local t = P.ticket_of(e)
  -- Waiting tickets only: a place-holder of a multi request is no waiter
  -- of its own (nor a lease's ticket that an earlier version left there).
  if t.l and not t.x and redis.call('HGET', P.RECS, t.l) == 'W|' .. e[1] then
    P:tenant_line('join', t.T or '', e[1])
  end
end
if #entries < n then
  -- Every waiting ticket is in the index: the order is `tenant` from the
  -- next grant on.
  P.ord = 't'
  P:tenant_save()
  redis.call('HDEL', P.META, 'oc')
  P:dispatch(nil)
  return {'order', 'tenant'}
end
redis.call('HSET', P.META, 'oc', entries[#entries][1])
return {'order', 'building'}
