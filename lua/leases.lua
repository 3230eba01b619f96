-- leases: every live lease of the pool, read only (see status.lua). A lease
-- past its deadline, or void (its resource left or came back since), is not
-- live and is left out. The owner is the ticket's field `o` (acquire.lua);
-- the lease id, which gives power over the lease, is never sent.
--
-- ARGV: none
-- Reply: {'leases', now_us, resource1, token1, owner1, granted_us1,
--         deadline_ms1, resource2, ...}
-- Errors: ALLOCATOR-CORRUPT naming RECS, for a live lease's record that is
--         damaged (gc removes it)
local out = {'leases', P.now_s}
local held = redis.call('ZRANGE', P.HELD, 0, -1)
for _, member in ipairs(held) do
  local at = string.find(member, '\0', 1, true)
  local lid = at and string.sub(member, at + 1)
  local L, _, damaged = nil, nil, nil
  if lid then
    L, _, damaged = P:lease_load(lid)
  end
  if damaged or (L and not P.utf8(L.res)) then
    return P:corrupt_lease(lid)
  end
  if L and L.deadline > P.now and P.counted(L, P:res_load(L.res)) then
    local e = redis.call('XRANGE', P.Q, L.ticket, L.ticket)[1]
    local owner = e and P.ticket_of(e).o or ''
    if not P.utf8(owner) then
      -- For people only, and not checked on the way in (acquire's hot
      -- path): shown as '?' rather than break the reply's decoding.
      owner = '?'
    end
    out[#out + 1] = L.res
    out[#out + 1] = L.token
    out[#out + 1] = owner
    out[#out + 1] = L.granted
    out[#out + 1] = L.deadline
  end
end
return out
