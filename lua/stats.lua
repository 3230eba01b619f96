-- stats: the pool's counters, read only (see status.lua). They are kept in
-- STATS by the scripts that change what they count: grants (one wait
-- histogram bucket field `w<i>` per grant, `ws` the sum of waits in ms),
-- `timeouts` (cancel.lua), `reclaimed` (P:reclaim, gc.lua), `revoked`
-- (remove.lua, revoke.lua), `dropped` (P:drop), `qr` (quarantines started by a release
-- with `quarantine=`: release.lua), `qo` (by an operator's `quarantine`:
-- quarantine.lua).
--
-- ARGV: none
-- Reply: {'stats', now_us, field1, value1, field2, value2, ...}
-- A field that holds no integer, or whose name no script writes (damage),
-- is left out: it reads as 0, and gc removes it.
local out = {'stats', P.now_s}
local fields = redis.call('HGETALL', P.STATS)
for i = 1, #fields, 2 do
  local v = fields[i + 1]
  if #v <= 20 and string.find(v, '^-?%d+$') and string.find(fields[i], '^%w+$') then
    out[#out + 1] = fields[i]
    out[#out + 1] = v
  end
end
return out
