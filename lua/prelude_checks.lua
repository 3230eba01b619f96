---------------------------------------------------------------------------
-- Checks: what a caller sends, and what the pool's keys hold
---------------------------------------------------------------------------

-- A user of a pool may run these scripts with any arguments, and may write
-- the pool's keys by hand: the ACL that lets the scripts write a key lets
-- its user write it too (lua/README.md, "Trust"). So each script checks
-- every argument it reads before its first write, against the bounds that
-- allocator/_core/checks.py checks (no call the library makes is refused: where
-- the Python counts characters, so do these; where it refuses what could
-- only spoil the caller's own records, these may let it through); a bad one
-- gets the error reply 'ALLOCATOR-ARG <op>: <argument> <why>', and nothing
-- is written. The hot scripts (acquire, release) first test the common
-- case in one cheap expression and call these only when it fails. Records
-- are checked as they are parsed: a damaged field that can be put right
-- safely is (in memory at once, saved by the next write of the record,
-- counted by gc); what cannot gets 'ALLOCATOR-CORRUPT <key>: <what>', never
-- a raw Lua error, and never between two writes that must go together.
-- Bounds are literals, not fields of P (a field is made on every call):
-- 315360000000 ms is ten years (MAX_SECONDS in _core/checks.py).

-- The reply to a bad argument: its name, why, and what came (shortened,
-- with control characters masked, so the reply stays one line).
function P:bad_arg(op, name, why, v)
  local got = 'nothing'
  if v then
    got = "'" .. self:shown(v) .. "'" .. (#v > 60 and '...' or '')
  end
  return redis.error_reply('ALLOCATOR-ARG ' .. op .. ': ' .. name .. ' ' .. why .. ', got ' .. got)
end

-- One argument: nil if it is good, else the error reply. `kind`:
-- 'int'   an integer from a to b, in the digits Python writes (no sign,
--         no leading zero, no exponent): several are stored as sent and
--         read back by int(), and '0' is compared as a string;
-- 'num'   an integer number from a to b in any form Lua reads (an argument
--         only ever used as a number: alive_ms);
-- 'flag'  '0' or '1';
-- 'text'  1 to a characters (Python counts characters: a text longer than
--         a bytes is counted in UTF-8 characters), none of the characters
--         in b ('|' in ids written into records and messages whose fields
--         '|' separates; '.' in a request's lease id, to which acquire_many
--         appends `.<i>`);
-- 'name'  a resource name: text of 1 to 1024 characters, UTF-8 (names go
--         back to Python, which decodes them), no control character (a
--         NUL would break the lex ranges of HELD and RLOG, `<name>\0...`;
--         Python refuses every control character).
function P:arg(op, name, v, kind, a, b)
  local why
  if kind == 'int' or kind == 'num' then
    local n = v and (kind == 'num' or v == '0' or string.find(v, '^[1-9]%d*$')) and tonumber(v)
    if n and n >= a and n <= b and n % 1 == 0 then
      return nil
    end
    why = 'must be an integer from ' .. a .. ' to ' .. b
  elseif kind == 'flag' then
    if v == '1' or v == '0' then
      return nil
    end
    why = "must be '0' or '1'"
  else
    local limit = kind == 'name' and 1024 or a
    if not v or v == '' or (#v > limit and (#v > 4 * limit or
        #v - select(2, string.gsub(v, '[\128-\191]', '')) > limit)) then
      why = 'must be 1 to ' .. limit .. ' characters long'
    elseif kind == 'name' and string.find(v, '%c') then
      why = 'must hold no control character'
    elseif kind == 'name' and not self.utf8(v) then
      why = 'must be UTF-8 text'
    end
    for i = 1, kind == 'text' and b and #b or 0 do
      if not why and string.find(v, string.sub(b, i, i), 1, true) then
        why = "must not hold '" .. string.sub(b, i, i) .. "'"
      end
    end
    if not why then
      return nil
    end
  end
  return self:bad_arg(op, name, why, v)
end

-- Is s UTF-8 as Python decodes it (no overlong form, no surrogate, nothing
-- past U+10FFFF)? ASCII is found at once; anything else byte by byte: a
-- lead byte, then its continuation bytes (the first of them in a narrower
-- range after E0, ED, F0 and F4).
function P.utf8(s)
  if not string.find(s, '[\128-\255]') then
    return true
  end
  local i = 1
  while i <= #s do
    local c, len, lo, hi = string.byte(s, i), 1, 128, 191
    if c > 244 or (c >= 128 and c < 194) then
      return false
    elseif c >= 240 then
      len, lo, hi = 4, c == 240 and 144 or 128, c == 244 and 143 or 191
    elseif c >= 224 then
      len, lo, hi = 3, c == 224 and 160 or 128, c == 237 and 159 or 191
    elseif c >= 194 then
      len = 2
    end
    for j = i + 1, i + len - 1 do
      local d = string.byte(s, j)
      if not d or d < (j == i + 1 and lo or 128) or d > (j == i + 1 and hi or 191) then
        return false
      end
    end
    i = i + len
  end
  return true
end

-- Text from the pool's keys for an error reply: shortened, control
-- characters (and, in what is not UTF-8, every byte past ASCII) masked.
function P:shown(s)
  s = string.sub(s, 1, 60)
  return (string.gsub(s, self.utf8(s) and '%c' or '[%c\128-\255]', '?'))
end

-- A stream id the server can read back: ms-seq, each part under 20 digits
-- (beyond 2^64 XRANGE refuses it, which would stop a script half-way).
function P.is_id(v)
  local ms, seq = string.match(v, '^(%d+)%-(%d+)$')
  return ms ~= nil and #ms < 20 and #seq < 20
end

-- A sorted-set score (-priority) as Python writes a number: finite, within
-- +-1e15, and in a form ZADD reads (no spaces, no hex, no inf or nan, no
-- underflow to 0: Redis refuses those mid-run).
function P.is_score(v)
  local n = string.find(v, '^[-+]?[%d.][%d.eE+-]*$') and tonumber(v)
  return n and n >= -1e15 and n <= 1e15 and (n ~= 0 or not string.find(v, '[1-9]'))
end

-- HINCRBY of a figure that a damaged field cannot stop: a field that holds
-- no integer (or would overflow) starts again from n. A figure is never a
-- decision, and a script must not die half-way for one. (redis.pcall costs
-- what redis.call does; P:count_wait, on every grant, has it inline.)
function P:add(key, field, n)
  local done = redis.pcall('HINCRBY', key, field, n)
  if type(done) == 'table' then
    self.mend_figure(done, key, field, n)
  end
end

-- After a HINCRBY (redis.pcall) that failed: a field that holds no integer,
-- or would overflow, starts again from n. Any other error (an ACL, a key of
-- another type) is no damage of a field: the command runs again under
-- redis.call, which raises it as it came. (Each pcall of the scripts treats
-- its failures so.)
function P.mend_figure(failed, key, field, n)
  local err = failed.err or ''
  if string.find(err, 'not an integer', 1, true) or string.find(err, 'overflow', 1, true) then
    return redis.call('HSET', key, field, n)
  end
  return redis.call('HINCRBY', key, field, n)
end
