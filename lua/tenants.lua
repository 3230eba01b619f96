-- tenants: one page of the pool's tenants, read only (see status.lua): who
-- waits and who holds a lease, per tenant, found by a walk of the queue
-- (the stream holds exactly the waiting and the leased tickets; a ticket's
-- field `T` names its tenant, none for the tenant ''); then the tenants'
-- figures (TEN, prelude_tenants.lua: grants, weights, counts). The pages
-- walk the stream by id, then TEN with HSCAN, so that no run reads every
-- ticket of a long queue: the client calls again with the cursor it was
-- given until that is ''.
--
-- ARGV: cursor ('' for the first page; then as given: `q<stream id>` in the
--       queue, `h<scan cursor>` in TEN), count (entries per page)
-- Reply: {'tenants', now_us, next ('': the last page), grants (the pool's
--         grants, all tenants: the sum of the wait histogram),
--         kind1, tenant1, a1, b1, c1, kind2, ...}
--        kind 'q' (the queue, one row per tenant met in this page): a
--        waiting requests (a multi request once), b live leases, c the id
--        of its first waiting ticket in this page ('' if none);
--        'g' grants of requests that named it, 'w' its weight, 'c' its
--        count (14 hex digits: 10000 a grant at weight 1): a, and b, c ''
-- Errors: ALLOCATOR-ARG (a bad cursor or count)
local cursor, count = ARGV[1], ARGV[2]
local bad = P:arg('tenants', 'count', count, 'int', 1, 10000)
local phase, from = string.sub(cursor or '', 1, 1), string.sub(cursor or '', 2)
if not bad and not (cursor == '' or (phase == 'q' and P.is_id(from)) or
    (phase == 'h' and string.find(from, '^%d+$') and #from < 20)) then
  bad = P:bad_arg('tenants', 'cursor', "must be '', q<stream id> or h<scan cursor>", cursor)
end
if bad then
  return bad
end
local n = tonumber(count)

local grants = 0
for _, v in ipairs(redis.call('HMGET', P.STATS, 'w0', 'w1', 'w2', 'w3', 'w4', 'w5', 'w6', 'w7',
    'w8', 'w9', 'w10', 'w11', 'w12', 'w13', 'w14')) do
  -- (A damaged figure reads as 0, as stats.lua has it.)
  grants = grants + (v and #v <= 20 and string.find(v, '^%d+$') and tonumber(v) or 0)
end
local out = {'tenants', P.now_s, '', grants}
local function row(kind, tenant, a, b, c)
  -- (Names are UTF-8 as the scripts write them; one written by hand that
  -- is not shows as '?', so that the reply still decodes.)
  out[#out + 1] = kind
  out[#out + 1] = P.utf8(tenant) and tenant or '?'
  out[#out + 1] = a
  out[#out + 1] = b
  out[#out + 1] = c
end

if cursor == '' or phase == 'q' then
  local entries = redis.call('XRANGE', P.Q, cursor == '' and '-' or '(' .. from, '+', 'COUNT', n)
  local seen, order = {}, {}
  for _, e in ipairs(entries) do
    local t = P.ticket_of(e)
    local raw = t.l and redis.call('HGET', P.RECS, t.l)
    local tenant = t.T or ''
    local waits = raw == 'W|' .. e[1]
    local holds = false
    if raw and not waits and string.sub(raw, 1, #e[1] + 3) == 'L|' .. e[1] .. '|' then
      local L = P:lease_load(t.l)
      holds = L and L.deadline > P.now and P.counted(L, P:res_load(L.res))
    end
    if waits or holds then
      local s = seen[tenant]
      if not s then
        s = {0, 0, ''}
        seen[tenant] = s
        order[#order + 1] = tenant
      end
      if waits then
        s[1] = s[1] + 1
        if s[3] == '' then
          s[3] = e[1]
        end
      else
        s[2] = s[2] + 1
      end
    end
  end
  for _, tenant in ipairs(order) do
    local s = seen[tenant]
    row('q', tenant, s[1], s[2], s[3])
  end
  out[3] = #entries >= n and 'q' .. entries[#entries][1] or 'h0'
  return out
end

local page = redis.call('HSCAN', P:key('tenants'), from, 'COUNT', n)
local fields = page[2]
for i = 1, #fields, 2 do
  local kind = string.sub(fields[i], 1, 2)
  if kind == 'g|' or kind == 'w|' or kind == 'c|' then
    row(string.sub(kind, 1, 1), string.sub(fields[i], 3), fields[i + 1], '', '')
  end
end
if page[1] ~= '0' then
  out[3] = 'h' .. page[1]
end
return out
