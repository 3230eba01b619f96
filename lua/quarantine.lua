-- quarantine: take a resource out of rotation for a while without holding a
-- lease (an operator's "this proxy is broken"). Its live leases stay valid;
-- it gets no new grant until the time ends, when whoever runs a script next
-- brings it back (P:unpark) and the queue is served. A longer quarantine or
-- throttle already running is kept; a draining resource stays draining (it
-- must never come back into rotation by this).
--
-- ARGV: name, ms
-- Reply: {'quarantined', until_ms} | {'draining'} | {'unknown'}
-- Errors: ALLOCATOR-ARG (a bad argument: nothing written)
local name, ms = ARGV[1], ARGV[2]
local bad = P:arg('quarantine', 'resource', name, 'name') or
  P:arg('quarantine', 'ms', ms, 'int', 1, 315360000000)
if bad then
  return bad
end

P:maintain()
local r = P:res_load(name)
if not r then
  return {'unknown'}
end
if r.state == 'd' then
  return {'draining'}
end
local untl = P.now + ms
if r.state == 'q' or r.state == 't' then
  untl = math.max(untl, tonumber(r.untl))
end
P:park(name, r, 'q', untl)
P:place(name, r, false)
P:res_save(name, r)
-- A quarantine started by an operator (`qo`; by a release: release.lua).
P:add(P.STATS, 'qo', '1')
P:event('quarantine', name, '', '')
P:dispatch(nil)
return {'quarantined', untl}
