-- status: one page of a snapshot of the pool as of now. Read only: it writes
-- nothing, so a monitoring user whose ACL allows only reads can run it, and
-- looking at a pool that does not exist creates nothing. What a writer would
-- handle first is accounted for instead: a lease past its deadline is not
-- counted (its resource's count of stale leases is sent along), and the
-- client treats a quarantine that ended as over.
--
-- The resources come in pages (HSCAN over RES), so that no run reads a
-- whole large pool: the client calls again with the cursor until it is '0'.
-- Every page carries the header (cheap: a few reads), as of its own run.
--
-- ARGV: cursor ('0' for the first page), count (resources per page, a hint)
-- Reply: {'status', now_us, exists (0 | 1), waiting, oldest_wait_ms, bindings,
--         bind_hits, bind_misses, order ('fifo' | 'tenant' | 'building':
--         the tenant index is being built, prelude_tenants.lua), tenants (1:
--         requests name tenants here, or the order is not fifo: tenants.lua
--         shows them; else 0), next_cursor ('0': the last page),
--         name1, record1, stale1, absent1, name2, ...}
--        records as in lua/README.md; stale: leases of that resource past
--        their deadline and not yet reclaimed; absent: its live leases whose
--        holder is not connected (see leases.lua)
-- Errors: ALLOCATOR-ARG (a bad cursor or count), ALLOCATOR-CORRUPT naming
--         RES and a resource whose record is damaged (status cannot tell
--         what it holds; gc mends it) or whose fence cannot grow
--         (lua/README.md, "Tokens")
local cursor, count = ARGV[1], ARGV[2]
local bad = P:arg('status', 'cursor', cursor, 'int', 0, 2 ^ 53) or
  P:arg('status', 'count', count, 'int', 1, 10000)
if bad then
  return bad
end

local keys = P:pool_keys()
local exists = redis.call('EXISTS', unpack(keys, 1, 15)) +
  redis.call('EXISTS', keys[17], keys[18], keys[19])
local meta = redis.call('HMGET', P.META, 'bhit', 'bmiss', 'xw', 'tu')
P:meta()
local order = P.ord == 't' and 'tenant' or (P.ord == 'b' and 'building' or 'fifo')
-- Figures of META the scripts only add to; a damaged one reads as 0.
local function figure(v)
  return v and #v < 16 and string.find(v, '^-?%d+$') and tonumber(v) or 0
end
-- A waiting multi request counts once, not once per entry (`xw`: its
-- place-holders, lua/README.md).
local waiting = math.max(0, P:waiting() - figure(meta[3]))
-- The head of the queue: its first ticket. Its
-- stream id is the server time (ms) it came in.
local oldest = 0
if waiting > 0 then
  local head = P:peek()
  if head then
    oldest = math.max(P.now - tonumber(string.match(head.id, '^(%d+)')), 0)
  end
end
local page = redis.call('HSCAN', P.RES, cursor, 'COUNT', count)
local out = {
  'status', P.now_s, exists > 0 and 1 or 0, waiting, oldest,
  redis.call('ZCOUNT', P.BEXP, '(' .. P.now, '+inf'), figure(meta[1]), figure(meta[2]),
  order, (meta[4] or P.ord) and 1 or 0, page[1],
}
local rows = page[2]
for i = 1, #rows, 2 do
  local name, raw = rows[i], rows[i + 1]
  -- (A damaged record is read as a writer would mend it: reads only.)
  local r = P:res_load(name, raw)
  if r.bad or r.stuck or not P.is_score(r.score) or not P.utf8(name) then
    local why = 'its record is malformed (gc mends it)'
    if r.stuck then
      why = 'its fence cannot grow (lua/README.md, "Tokens"): it is out of rotation; remove ' ..
        'it and add it under another name'
    elseif not (r.bad or not P.is_score(r.score)) then
      why = 'its name is not UTF-8 (no script writes one): remove it'
    end
    return redis.error_reply('ALLOCATOR-CORRUPT ' .. P.RES .. ": resource '" .. P:shown(name) ..
      "': " .. why)
  end
  -- Its leases past their deadline, and those whose holder is not
  -- connected (the lease index HELD, by name: only for a resource with
  -- leases at all).
  local stale, absent = 0, 0
  if r.used > 0 then
    local held = redis.call('ZRANGEBYLEX', P.HELD, '[' .. name .. '\0', '(' .. name .. '\1')
    for _, member in ipairs(held) do
      local L = P:lease_load(string.sub(member, #name + 2))
      if L and P.counted(L, r) then
        if L.deadline <= P.now then
          stale = stale + 1
        elseif P:presence_of(L.cid) == 0 then
          absent = absent + 1
        end
      end
    end
  end
  out[#out + 1] = name
  out[#out + 1] = raw
  out[#out + 1] = stale
  out[#out + 1] = absent
end
return out
