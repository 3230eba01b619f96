-- bind: set a soft binding by hand.
--
-- ARGV: binding name, resource, bind_ttl_ms
-- Reply: {'bound'} | {'unknown'}   the resource is not in the pool
-- Errors: ALLOCATOR-ARG (a bad argument: nothing written)
local name, resource, ttl = ARGV[1], ARGV[2], ARGV[3]
local bad = P:arg('bind', 'name', name, 'text', 1024) or
  P:arg('bind', 'resource', resource, 'name') or
  P:arg('bind', 'bind_ttl_ms', ttl, 'int', 1, 315360000000)
if bad then
  return bad
end

if redis.call('HEXISTS', P.RES, resource) == 0 then
  return {'unknown'}
end
redis.call('HSET', P.BIND, name, resource)
redis.call('ZADD', P.BEXP, P.now + ttl, name)
return {'bound'}
