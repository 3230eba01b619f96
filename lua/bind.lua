-- bind: set a soft binding by hand.
--
-- ARGV: binding name, resource, bind_ttl_ms
-- Reply: {'bound'} | {'unknown'}   the resource is not in the pool
local name, resource, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])

if redis.call('HEXISTS', P.RES, resource) == 0 then
  return {'unknown'}
end
redis.call('HSET', P.BIND, name, resource)
redis.call('ZADD', P.BEXP, P.now + ttl, name)
return {'bound'}
