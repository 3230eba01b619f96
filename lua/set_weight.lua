-- set_weight: a tenant's weight under the order `tenant`
-- (prelude_tenants.lua): each grant adds 1 / weight to its count, so under
-- load tenants are served in proportion to their weights. Kept with the
-- pool (TEN `w|<tenant>`; weight 1, the default, removes it); it applies
-- from the tenant's next grant on.
--
-- ARGV: tenant ('' for requests that name none), weight (a number from
--       0.01 to 100)
-- Reply: {'weight'}
-- Errors: ALLOCATOR-ARG (a bad argument: nothing written)
local tenant, w = ARGV[1], ARGV[2]
local n = w and string.find(w, '^%d[%d.eE+-]*$') and tonumber(w)
local bad = (tenant == nil and P:bad_arg('set_weight', 'tenant', 'is missing', nil)) or
  P:arg('set_weight', 'tenant', tenant, 'tenant', 200) or
  (not (n and n >= 0.01 and n <= 100) and
    P:bad_arg('set_weight', 'weight', 'must be a number from 0.01 to 100', w))
if bad then
  return bad
end

local ten = P:key('tenants')
if n == 1 then
  redis.call('HDEL', ten, 'w|' .. tenant)
else
  redis.call('HSET', ten, 'w|' .. tenant, w)
end
return {'weight'}
