-- tenants: one page of the pool's tenants, read only (see status.lua): who
-- waits, per tenant, found by a walk of the queue (the stream holds the
-- waiting requests; a ticket's field `T` names its tenant, none for the
-- tenant ''); who holds a lease, found by a walk of the lease index HELD
-- (a lease's record keeps its request's tenant); then the tenants' figures
-- (TEN, prelude_tenants.lua: grants, weights, counts). The pages walk the
-- stream by id, HELD by member, then TEN with HSCAN, so that no run reads
-- every ticket of a long queue: the client calls again with the cursor it
-- was given until that is ''.
--
-- ARGV: cursor ('' for the first page; then as given: `q<stream id>` in the
--       queue, `l<member>` in HELD (`l` at its start), `h<scan cursor>` in
--       TEN), count (entries per page)
-- Reply: {'tenants', now_us, next ('': the last page), grants (the pool's
--         grants, all tenants: the sum of the wait histogram),
--         kind1, tenant1, a1, b1, c1, kind2, ...}
--        kind 'q' (one row per tenant met in this page): a waiting
--        requests (a multi request once), b live leases, c the id of its
--        first waiting ticket in this page ('' if none);
--        'g' grants of requests that named it, 'w' its weight, 'c' its
--        count (14 hex digits: 10000 a grant at weight 1): a, and b, c ''
-- Errors: ALLOCATOR-ARG (a bad cursor or count)
local cursor, count = ARGV[1], ARGV[2]
local bad = P:arg('tenants', 'count', count, 'int', 1, 10000)
local phase, from = string.sub(cursor or '', 1, 1), string.sub(cursor or '', 2)
if not bad and not (cursor == '' or (phase == 'q' and P.is_id(from)) or phase == 'l' or
    (phase == 'h' and string.find(from, '^%d+$') and #from < 20)) then
  bad = P:bad_arg('tenants', 'cursor', "must be '', q<stream id>, l<member> or h<scan cursor>",
    cursor)
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

-- Rows of this page, one per tenant, in the order met.
local seen, order = {}, {}
local function count_in(tenant, k)
  local s = seen[tenant]
  if not s then
    s = {0, 0, ''}
    seen[tenant] = s
    order[#order + 1] = tenant
  end
  s[k] = s[k] + 1
  return s
end
local function rows()
  for _, tenant in ipairs(order) do
    local s = seen[tenant]
    row('q', tenant, s[1], s[2], s[3])
  end
end

if cursor == '' or phase == 'q' then
  local entries = redis.call('XRANGE', P.Q, cursor == '' and '-' or '(' .. from, '+', 'COUNT', n)
  for _, e in ipairs(entries) do
    local t = P.ticket_of(e)
    if t.l and redis.call('HGET', P.RECS, t.l) == 'W|' .. e[1] then
      local s = count_in(t.T or '', 1)
      if s[3] == '' then
        s[3] = e[1]
      end
    end
  end
  rows()
  out[3] = #entries >= n and 'q' .. entries[#entries][1] or 'l'
  return out
end

if phase == 'l' then
  local held, live = P:held_page(from, n)
  for _, L in ipairs(live) do
    count_in(L.T, 2)
  end
  rows()
  out[3] = #held >= n and 'l' .. held[#held] or 'h0'
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
