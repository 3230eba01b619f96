-- remove: a resource without leases leaves at once; a leased one stops being
-- granted and leaves with its last lease (draining). With force, it leaves
-- now and its leases are void: renew fails and release returns false, and
-- their holders are told so on their presence channel (P:tell_end).
--
-- ARGV: force ('1' | '0'), name...
-- Reply: {'removed', count}   unknown names are not counted
-- Errors: ALLOCATOR-ARG (a bad argument: nothing written)
local bad = P:arg('remove', 'force', ARGV[1], 'flag')
for i = 2, #ARGV do
  bad = bad or P:arg('remove', 'resource', ARGV[i], 'name')
end
if bad then
  return bad
end
local force = ARGV[1] == '1'

P:maintain()
local n = 0
for i = 2, #ARGV do
  local name = ARGV[i]
  local r = P:res_load(name)
  if r then
    n = n + 1
    if force or r.used <= 0 then
      -- Its live leases (if forced) are revoked: counted, their holders
      -- told (P:tell_end; from the index of live leases), then void.
      P:note('revoked', r.used)
      if r.used > 0 then
        for _, member in ipairs(redis.call('ZRANGEBYLEX', P.HELD, '[' .. name .. '\0',
            '(' .. name .. '\1')) do
          local lid = string.sub(member, #name + 2)
          local L = P:lease_load(lid)
          if L then
            P:tell_end(lid, L.cid)
            P:event('revoke', name, L.token, L.cid)
          end
        end
      end
      P:retire(name, r)
    else
      redis.call('ZREM', P.PARK, name)
      r.state, r.untl = 'd', '0'
      P:place(name, r, false)
      P:res_save(name, r)
    end
  end
end
P:dispatch(nil)
return {'removed', n}
