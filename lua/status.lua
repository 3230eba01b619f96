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
local exists = redis.call('EXISTS', unpack(KEYS, 1, 15))
local meta = redis.call('HMGET', P.META, 'bhit', 'bmiss', 'xw')
-- A waiting multi request counts once, not once per entry (`xw`: its
-- place-holders, lua/README.md).
local waiting = math.max(0, P:waiting() - tonumber(meta[3] or 0))
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
  redis.call('ZCOUNT', P.BEXP, '(' .. P.now, '+inf'), tonumber(meta[1] or 0),
  tonumber(meta[2] or 0),
}
local rows = redis.call('HGETALL', P.RES)
for i = 1, #rows, 2 do
  out[#out + 1] = rows[i]
  out[#out + 1] = rows[i + 1]
  out[#out + 1] = stale[rows[i]] or 0
end
return out
