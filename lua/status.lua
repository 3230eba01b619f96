-- status: a consistent snapshot of the pool, after handling what came due.
--
-- ARGV: none
-- Reply: {'status', now_us, free, waiting, bindings, bind_hits, bind_misses,
--         name1, record1, name2, record2, ...}   records as in lua/README.md
P:maintain()
P:dispatch(nil)
local meta = redis.call('HMGET', P.META, 'bhit', 'bmiss')
local out = {
  -- A waiting multi request counts once, not once per entry.
  'status', P.now_s, redis.call('ZCARD', P.FREE),
  math.max(0, P:waiting() - tonumber(redis.call('HGET', P.META, 'xw') or 0)),
  redis.call('ZCOUNT', P.BEXP, '(' .. P.now, '+inf'), tonumber(meta[1] or 0),
  tonumber(meta[2] or 0),
}
local rows = redis.call('HGETALL', P.RES)
for i = 1, #rows do
  out[#out + 1] = rows[i]
end
return out
