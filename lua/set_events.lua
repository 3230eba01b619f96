-- set_events: switch the pool's event log on, keeping about `maxlen` of its
-- latest entries (older ones are trimmed, `XADD ... MAXLEN ~`), or off
-- ('0'). The setting is META `ev`, read by every run with the rest of META
-- (P:meta); the log is `<p>:events` (P:event). Switched off, the entries already
-- written stay (capped as they were) until the pool is deleted; a smaller
-- length trims the log at its next entry (no XTRIM: the pool's ACL lines
-- need no command more).
--
-- ARGV: maxlen (0 to 10,000,000; '0': off)
-- Reply: {'events', maxlen}
-- Errors: ALLOCATOR-ARG (a bad argument: nothing written)
local n = ARGV[1]
local bad = P:arg('set_events', 'maxlen', n, 'int', 0, 10000000)
if bad then
  return bad
end

P:maintain()
if n == '0' then
  redis.call('HDEL', P.META, 'ev')
else
  redis.call('HSET', P.META, 'ev', n)
end
return {'events', tonumber(n)}
