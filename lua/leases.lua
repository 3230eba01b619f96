-- leases: one page of the live leases of the pool, read only (see
-- status.lua). A lease past its deadline, or void (its resource left or came
-- back since), is not live and is left out. The owner and the tenant are
-- the request's, kept in the lease's record (prelude_leases.lua); the lease
-- id, which gives power over the lease, is never sent. The pages walk the lease index HELD (members
-- `<resource>\0<lease id>`, all of score 0) in lexical order, so that no run
-- reads every lease of a large pool: the client calls again from the member
-- it was given until that is ''.
--
-- ARGV: after (the member the last page ended on; '' for the first page),
--       count (index members per page)
-- Reply: {'leases', now_us, next ('' : the last page), resource1, token1,
--         owner1, granted_us1, deadline_ms1, present1, client1, tenant1,
--         resource2, ...}
--        present: 1 if the holder's client is connected (its presence
--        channel has a subscriber), 0 if not (gone, or reconnecting), -1 if
--        nobody can tell (a client without a presence, or a server or ACL
--        that cannot count subscribers); client: the holder's client id
--        (clients.lua shows the client); tenant: the request's ('' for
--        none, prelude_tenants.lua)
-- Errors: ALLOCATOR-ARG (a bad count), ALLOCATOR-CORRUPT naming RECS, for a
--         live lease's record that is damaged (gc removes it)
local after, count = ARGV[1], ARGV[2]
local bad = P:arg('leases', 'count', count, 'int', 1, 10000)
if bad then
  return bad
end

local held, live, damaged = P:held_page(after, count)
if damaged then
  return P:corrupt_lease(damaged)
end
local out = {'leases', P.now_s, #held == tonumber(count) and held[#held] or ''}
for _, L in ipairs(live) do
  local owner, tenant = L.o, L.T
  if not P.utf8(owner) then
    -- For people only, and not checked on the way in (acquire's hot
    -- path): shown as '?' rather than break the reply's decoding.
    owner = '?'
  end
  if not P.utf8(tenant) then
    -- (Checked on the way in: only a record written by hand.)
    tenant = '?'
  end
  out[#out + 1] = L.res
  out[#out + 1] = L.token
  out[#out + 1] = owner
  out[#out + 1] = L.granted
  out[#out + 1] = L.deadline
  out[#out + 1] = P:presence_of(L.cid)
  out[#out + 1] = L.cid
  out[#out + 1] = tenant
end
return out
