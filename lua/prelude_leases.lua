---------------------------------------------------------------------------
-- Leases
---------------------------------------------------------------------------

-- What the Functions library keeps across calls by a text, a record's or
-- META's `nd` or `nh` (RV_OF, LEASE_OF, RES_OF, TIME_OF: prelude_defaults.lua),
-- [1] counting them: at 1,000 all are forgotten first (texts never read
-- again: a deleted pool's, say).
function P.keep(kept, text, value, was)
  if kept[1] >= 1000 then
    for old in pairs(kept) do
      kept[old] = nil
    end
    kept[1] = 0
  elseif was and kept[was] == value then
    -- (RES_OF, LEASE_OF) the record itself is kept (P:res_save,
    -- P:lease_save), under the last text it was saved as only (`kt`):
    -- the text it was kept under before, in the same run, is forgotten.
    kept[was], kept[1] = nil, kept[1] - 1
  end
  kept[text], kept[1] = value, kept[1] + 1
end

-- L|ticket|token|granted_us|deadline_ms|ttl_ms|cid|pushed|resource\0tenant\0owner
-- `pushed` is 1 if the grant went to the waiter's signal list (0: handed
-- over in a script reply); such a grant is *unclaimed* while its lease id is
-- in PICK (see P:claim). The tenant and the owner are the request's (for
-- leases.lua and tenants.lua: the ticket left the queue at the grant); a
-- resource name holds no NUL, a tenant neither, so the owner is the rest,
-- whatever it holds. A record an earlier version wrote ends with the
-- resource: its tenant and owner read as ''.
-- Returns the lease (or nil) and the raw record of a waiting one (W|ticket).
-- All fields stay strings but the deadline. A record that is neither, as
-- the scripts write them, is damaged: nil, nil and the raw record. Those it
-- meets on the way (maintenance, dispatch, take-back) a script leaves for
-- gc, which removes them; a script asked about one by its owner replies
-- ALLOCATOR-CORRUPT (P.corrupt_lease). `raw`: the record, read already
-- (gc), as P:res_load takes it.
function P:lease_load(lid, raw)
  raw = raw or redis.call('HGET', self.RECS, lid)
  if not raw then
    return nil, nil
  end
  -- Written by an earlier call of this library (P:lease_save): handed
  -- over, taken out, since its taker may change it.
  local kept = self.LEASE_OF
  local L = kept and kept[raw]
  if L then
    kept[raw], kept[1] = nil, kept[1] - 1
    return L, raw
  end
  if string.byte(raw, 1) ~= 76 then -- 'L'
    if string.byte(raw, 1) == 87 and self.is_id(string.sub(raw, 3)) then -- 'W'
      return nil, raw
    end
    return nil, nil, raw
  end
  local ticket, token, granted, deadline, ttl, cid, pickup, res = raw:match(
    '^L|(%d+%-%d+)|(%d+)|(%d+)|(%d+)|(%d+)|([^|]+)|([01])|(.+)$')
  if not ticket or (#ticket > 20 and not self.is_id(ticket)) or #token > 19 then
    return nil, nil, raw
  end
  local T, o = '', ''
  local at = string.find(res, '\0', 1, true)
  if at then
    local rest = string.sub(res, at + 1)
    local to = string.find(rest, '\0', 1, true)
    if at == 1 or not to then
      return nil, nil, raw
    end
    res, T, o = string.sub(res, 1, at - 1), string.sub(rest, 1, to - 1), string.sub(rest, to + 1)
  end
  return {
    ticket = ticket, token = token, granted = granted, deadline = deadline + 0,
    ttl = ttl, cid = cid, pickup = pickup, res = res, T = T, o = o,
  }, raw
end

-- The reply to a caller whose own record (its lease id's) is damaged.
function P:corrupt_lease(lid)
  return redis.error_reply('ALLOCATOR-CORRUPT ' .. self.RECS .. ': the record of lease ' ..
    self:shown(lid) .. ' is malformed (gc removes it)')
end

-- `dl`: the deadline as P.istr writes it (nil: `..` converts it).
-- In the Functions library the record's text is kept with the lease
-- itself (P.keep), so that the next call to load it (its release,
-- its next renew) need not parse it: about 14,000 instructions for a load.
-- A lease is changed only before its save (P:grant, renew.lua), as a
-- resource record is (P:res_save). A text names its lease exactly (its
-- ticket is its own): a text the pool no longer holds is never read again.
function P:lease_save(lid, L, dl)
  local text = 'L|' .. L.ticket .. '|' .. L.token .. '|' .. L.granted .. '|' ..
    (dl or L.deadline) .. '|' .. L.ttl .. '|' .. L.cid .. '|' .. L.pickup .. '|' .. L.res ..
    '\0' .. L.T .. '\0' .. L.o
  redis.call('HSET', self.RECS, lid, text)
  if self.LEASE_OF then
    self.keep(self.LEASE_OF, text, L, L.kt)
    L.kt = text
  end
end

function P.lease_reply(L)
  return {'granted', L.ticket, L.token, L.granted, L.deadline, L.ttl, L.res}
end

-- The grant message is built from fields that never change, so that a later
-- script can find it in the list again (LPOS) or take it out (LREM). It goes
-- to the signal list of the waiter's client, SIG .. cid, whose reader routes
-- it to the waiter by lease id.
function P.grant_msg(lid, L)
  return 'g|' .. lid .. '|' .. L.ticket .. '|' .. L.token .. '|' .. L.granted .. '|' .. L.ttl ..
    '|' .. L.res
end

-- A pushed grant is *claimed* once its owner has it: its client's reader
-- acknowledged it (a plain ZREM of the lease id from PICK, sent with the
-- reader's next read), it was handed over in a script reply (poll, a retried
-- acquire: this function), or it was renewed. A reader that pops a grant and
-- finds no waiter for it releases it only while it is unclaimed (release.lua,
-- `unclaimed`), so a late or repeated message never releases a lease its
-- owner holds. Here: take back the pushed message if nobody popped it yet,
-- from the signal list of the lease's client, where P:grant pushed it.
function P:claim(lid, L)
  if L.pickup == '1' and redis.call('ZREM', self.PICK, lid) == 1 then
    redis.call('LREM', self.SIG .. L.cid, '1', self.grant_msg(lid, L))
  end
end

function P:unclaimed(lid, L)
  return L.pickup == '1' and redis.call('ZSCORE', self.PICK, lid) ~= false
end

-- A lease counts (is one of its resource's `used`) unless the resource left
-- the pool or was removed and added again since the grant (token <= rv).
function P.counted(L, r)
  return r ~= nil and (r.rv == '0' or tonumber(L.token) > tonumber(r.rv))
end

-- The same as P.counted(L, P:res_load(L.res)), for a renew, which needs
-- nothing else of the record: only its `rv`, which depends on the record's
-- text alone (P:res_load; P:res_mend reads other keys only for other
-- fields). In the Functions library the `rv` of a text is kept across
-- calls (RV_OF: up to 1,000 texts, then it starts again; a record is at
-- most about 1,100 bytes, so about 1 MB of Lua memory at worst, far less
-- with short names), and a resource's
-- record only changes when one of its leases is granted or ends: most
-- renews skip the parse and the record's table (about 15,000
-- instructions). As a script (EVALSHA) RV_OF is made on every call, and
-- this is P:res_load.
function P:counts(L)
  local r = self.records[L.res]
  if r ~= nil then
    return self.counted(L, r or nil)
  end
  local raw = redis.call('HGET', self.RES, L.res)
  if not raw then
    self.records[L.res] = false
    return false
  end
  local rv = self.RV_OF[raw]
  if not rv then
    rv = self:res_load(L.res, raw).rv
    self.keep(self.RV_OF, raw, rv)
  end
  return rv == '0' or tonumber(L.token) > tonumber(rv)
end

-- A page of the index of live leases HELD: the `count` members after
-- `after` ('' from its start), in lexical order; the live leases among
-- them (not past their deadline, not void); and
-- the lease id of the first record of the page that is damaged or names a
-- resource that is not UTF-8 (no script writes one), which leases.lua
-- reports. For the views that list leases (leases, clients, tenants).
function P:held_page(after, count)
  local held = redis.call('ZRANGEBYLEX', self.HELD, after == '' and '-' or '(' .. after, '+',
    'LIMIT', '0', count)
  local live, bad = {}, nil
  for _, member in ipairs(held) do
    local at = string.find(member, '\0', 1, true)
    local lid = at and string.sub(member, at + 1)
    local L, damaged = nil, nil
    if lid then
      local _
      L, _, damaged = self:lease_load(lid)
    end
    if not bad and (damaged or (L and not self.utf8(L.res))) then
      bad = lid
    end
    if L and L.deadline > self.now and self.counted(L, self:res_load(L.res)) then
      live[#live + 1] = L
    end
  end
  return held, live, bad
end

-- End a lease record: release, expiry, revocation, take-back, or a cancel
-- that raced a grant (its ticket left the queue at the grant). A grant
-- message nobody took is taken off its list, so no stray message is left. Returns the resource record with `used` lowered
-- (not yet saved, so the caller may park it first), or nil if the lease no
-- longer counted.
function P:end_lease(lid, L)
  redis.call('HDEL', self.RECS, lid)
  redis.call('ZREM', self.EXP, lid)
  if L.pickup == '1' then
    self:claim(lid, L)
  end
  redis.call('ZREM', self.HELD, L.res .. '\0' .. lid)
  local r = self:res_load(L.res)
  if self.counted(L, r) then
    r.used = r.used - 1
    return r
  end
  return nil
end

function P:end_and_settle(lid, L)
  local r = self:end_lease(lid, L)
  if r then
    self:settle(L.res, r)
  end
end
