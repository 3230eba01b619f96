-- status: a snapshot of the pool as of now. Read only: it writes nothing, so
-- a monitoring user whose ACL allows only reads can run it, and looking at a
-- pool that does not exist creates nothing. What a writer would handle first
-- is accounted for instead: a lease past its deadline is not counted (its
-- resource's count of stale leases is sent along), and the client treats a
-- quarantine that ended as over.
--
-- ARGV: none
-- Reply: {'status', now_us, exists (0 | 1), waiting, oldest_wait_ms, bindings,
--         bind_hits, bind_misses, name1, record1, stale1, name2, ...}
--        records as in lua/README.md; stale: leases of that resource past
--        their deadline and not yet reclaimed
-- Errors: ALLOCATOR-CORRUPT naming RES and a resource whose record is
--         damaged (status cannot tell what it holds; gc mends it) or whose
--         fence cannot grow (lua/README.md, "Tokens")
local exists = redis.call('EXISTS', unpack(KEYS, 1, 15))
local meta = redis.call('HMGET', P.META, 'bhit', 'bmiss', 'xw')
-- Figures of META the scripts only add to; a damaged one reads as 0.
local function figure(v)
  return v and #v < 16 and string.find(v, '^-?%d+$') and tonumber(v) or 0
end
-- A waiting multi request counts once, not once per entry (`xw`: its
-- place-holders, lua/README.md).
local waiting = math.max(0, P:waiting() - figure(meta[3]))
-- The head of the queue: the first ticket after the last one granted. Its
-- stream id is the server time (ms) it came in.
local oldest = 0
if waiting > 0 then
  local head = P:peek()
  if head then
    oldest = math.max(P.now - tonumber(string.match(head.id, '^(%d+)')), 0)
  end
end
local stale = {}
local due = redis.call('ZRANGEBYSCORE', P.EXP, '-inf', P.now)
for _, lid in ipairs(due) do
  local L = P:lease_load(lid)
  if L and P.counted(L, P:res_load(L.res)) then
    stale[L.res] = (stale[L.res] or 0) + 1
  end
end
local out = {
  'status', P.now_s, exists > 0 and 1 or 0, waiting, oldest,
  redis.call('ZCOUNT', P.BEXP, '(' .. P.now, '+inf'), figure(meta[1]), figure(meta[2]),
}
local rows = redis.call('HGETALL', P.RES)
for i = 1, #rows, 2 do
  -- (A damaged record is read as a writer would mend it: reads only.)
  local r = P:res_load(rows[i], rows[i + 1])
  if r.bad or r.stuck or not P.is_score(r.score) or not P.utf8(rows[i]) then
    local why = 'its record is malformed (gc mends it)'
    if r.stuck then
      why = 'its fence cannot grow (lua/README.md, "Tokens"): it is out of rotation; remove ' ..
        'it and add it under another name'
    elseif not (r.bad or not P.is_score(r.score)) then
      why = 'its name is not UTF-8 (no script writes one): remove it'
    end
    return redis.error_reply('ALLOCATOR-CORRUPT ' .. P.RES .. ": resource '" .. P:shown(rows[i]) ..
      "': " .. why)
  end
  out[#out + 1] = rows[i]
  out[#out + 1] = rows[i + 1]
  out[#out + 1] = stale[rows[i]] or 0
end
return out
