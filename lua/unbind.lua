-- unbind: drop a soft binding.
--
-- ARGV: binding name
-- Reply: {'unbound', 1 | 0}   0: there was no live binding
-- Errors: ALLOCATOR-ARG (a bad argument: nothing written)
local name = ARGV[1]
local bad = P:arg('unbind', 'name', name, 'text', 1024)
if bad then
  return bad
end

local live = tonumber(redis.call('ZSCORE', P.BEXP, name) or 0) > P.now
redis.call('ZREM', P.BEXP, name)
local had = redis.call('HDEL', P.BIND, name)
return {'unbound', (had == 1 and live) and 1 or 0}
