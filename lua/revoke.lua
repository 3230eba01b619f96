-- revoke: end one lease now (an operator's "this holder must let go"). The
-- resource keeps its capacity, priority and rate, and its slot goes to the
-- next waiter in the same run; the holder is told at once on its presence
-- channel (P:tell_end: its `lost()` turns true), and otherwise learns it at
-- its next renew (`LeaseLost`) or release (False); its token fences
-- anything it still sends.
--
-- The lease is named either by its id (the holder's own code), or as an
-- operator sees it (`leases`, `status`): by its resource and, where the
-- resource holds several leases, its fencing token (a token names one
-- grant). The resource's leases are found in the index of live leases
-- (HELD, a lex range `<resource>\0...`: O(log n) plus its leases).
--
-- ARGV: 'id', lid (the lease's id)
--     | 'res', resource, token ('' : the resource's one lease)
-- Reply: {'revoked', token}
--      | {'unknown'}   no live lease has that id, or holds that resource
--                      (with that token): it ended (released, expired,
--                      revoked before), or it never was
--      | {'several', token1, token2, ...}   by resource without a token,
--                      and the resource holds several live leases: nothing
--                      written; their tokens
-- Errors: ALLOCATOR-ARG (a bad argument: nothing written), ALLOCATOR-CORRUPT
--         (the record of this lease id is damaged)
local how = ARGV[1]
local bad
if how == 'res' then
  bad = P:arg('revoke', 'resource', ARGV[2], 'name') or
    (ARGV[3] ~= '' and P:arg('revoke', 'token', ARGV[3], 'int', 1, 9223372036854775807))
else
  bad = (how ~= 'id' and P:bad_arg('revoke', 'how', "must be 'id' or 'res'", how)) or
    P:arg('revoke', 'lid', ARGV[2], 'text', 128)
end
if bad then
  return bad
end

P:maintain()
local lid, L
if how == 'id' then
  lid = ARGV[2]
  local found, _, damaged = P:lease_load(lid)
  L = found
  if damaged then
    return P:corrupt_lease(lid)
  end
else
  -- The resource's live leases (past their deadline or void: not live).
  local name, token = ARGV[2], ARGV[3]
  local r = P:res_load(name)
  local live = {}
  for _, member in ipairs(redis.call('ZRANGEBYLEX', P.HELD, '[' .. name .. '\0',
      '(' .. name .. '\1')) do
    local id = string.sub(member, #name + 2)
    local S = P:lease_load(id)
    if S and S.deadline > P.now and P.counted(S, r) and (token == '' or S.token == token) then
      live[#live + 1] = {id, S}
    end
  end
  if #live > 1 then
    local out = {'several'}
    for _, pair in ipairs(live) do
      out[#out + 1] = pair[2].token
    end
    return out
  end
  if live[1] then
    lid, L = live[1][1], live[1][2]
  end
end
if not L then
  return {'unknown'}
end
local r = P:end_lease(lid, L)
if not r or L.deadline <= P.now then
  -- Past its deadline (not yet reclaimed) or void: not live any more.
  if r then
    P:settle(L.res, r)
  end
  P:dispatch(nil)
  return {'unknown'}
end
P:note('revoked', 1)
P:event('revoke', L.res, L.token, L.cid)
P:settle(L.res, r)
P:tell_end(lid, L.cid)
P:dispatch(nil)
return {'revoked', L.token}
