-- unbind: drop a soft binding.
--
-- ARGV: binding name
-- Reply: {'unbound', 1 | 0}   0: there was no live binding
local name = ARGV[1]

local live = tonumber(redis.call('ZSCORE', P.BEXP, name) or 0) > P.now
redis.call('ZREM', P.BEXP, name)
local had = redis.call('HDEL', P.BIND, name)
return {'unbound', (had == 1 and live) and 1 or 0}
