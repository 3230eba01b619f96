-- bind: set a soft binding by hand.
--
-- ARGV: binding name, resource, bind_ttl_ms
-- Reply: {'bound'} | {'unknown'}   the resource is not in the pool
local name, resource, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])

if redis.call('HEXISTS', K_RES, resource) == 0 then
  return {'unknown'}
end
redis.call('HSET', K_BIND, name, resource)
redis.call('ZADD', K_BEXP, fmt(NOW + ttl), name)
return {'bound'}
