-- llm-bulkhead lease table, format 2 (format 1 plus per-class shares). The same algorithm as
-- src/cluster/allocator.rs and classes.rs (`renew`, `release`); tests/cluster_redis.rs checks
-- that the two agree on random tables.
-- KEYS[1] meta hash, KEYS[2] leases hash (replica id -> "as:at:gs:gt:hs:ht:ws:wt:renewed_at"
-- then, per class, ";afs:aft:acs:act:gfs:gft:gcs:gct:hs:ht:ws:wt"), KEYS[3] format 1's meta
-- hash (superseded: marked so that a format-1 replica meets a foreign format and fails closed).
-- ARGV: op, format, gs, gt, fs, ft, ttl, quarantine, replica, as, at, hs, ht, ws, wt, epoch, seq,
-- class parameters "name,Fs,Ft,Cs,Ct,ms,mt;...", class reports "name:afs:aft:acs:act:hs:ht:ws:wt;...".
local FORMAT = 'llm-bulkhead-lease/2'
local OLD_FORMAT = 'llm-bulkhead-lease/1'
local MAX_CLASSES = 64
local MAXA = 1099511627776 -- 2^40, allocator::MAX_AMOUNT
local MAXN = 9007199254740991 -- 2^53 - 1: exact in a Lua number
local MAX_REPLICAS = 1024

local function fail(code, detail)
  return redis.error_reply('LLMBH_' .. code .. ' ' .. detail)
end

-- A decimal integer in [0, max], or nil.
local function int(s, max)
  if type(s) ~= 'string' or #s == 0 or #s > 16 or not string.match(s, '^%d+$') then
    return nil
  end
  local n = tonumber(s)
  if n == nil or n > max then
    return nil
  end
  return n
end

-- floor(a / b) exactly, for integers a >= 0, b > 0 below 2^53.
local function idiv(a, b)
  local q = math.floor(a / b)
  while q * b > a do q = q - 1 end
  while (q + 1) * b <= a do q = q + 1 end
  return q
end

local function min(a, b) if a < b then return a end return b end
local function max(a, b) if a > b then return a end return b end

if ARGV[2] ~= FORMAT then
  return fail('FOREIGN', 'client format')
end
local op = ARGV[1]
if op ~= 'renew' and op ~= 'release' then
  return fail('BADARG', 'op')
end
local p = {}
for i = 3, 8 do
  p[i] = int(ARGV[i], MAXN)
  if p[i] == nil then return fail('BADARG', 'parameter ' .. i) end
end
local rid = ARGV[9]
if type(rid) ~= 'string' or #rid == 0 or #rid > 200 then
  return fail('BADARG', 'replica')
end
local q = {}
for i = 10, 17 do
  q[i] = int(ARGV[i], MAXN)
  if q[i] == nil then return fail('BADARG', 'argument ' .. i) end
end
local gs, gt, fs, ft, ttl, quar = p[3], p[4], p[5], p[6], p[7], p[8]
local as, at, hs, ht, ws, wt, repoch, rseq = q[10], q[11], q[12], q[13], q[14], q[15], q[16], q[17]
local cparams = ARGV[18]
if type(cparams) ~= 'string' or #cparams > 8192 then return fail('BADARG', 'classes') end
local params = table.concat({ ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8] }, ':')
  .. '|' .. cparams
local hold = ttl + quar

-- Splits `s` on `sep` (a single character); an empty string is no part.
local function split(s, sep)
  local out = {}
  if #s == 0 then return out end
  local from = 1
  while true do
    local at = string.find(s, sep, from, true)
    if at == nil then
      out[#out + 1] = string.sub(s, from)
      return out
    end
    out[#out + 1] = string.sub(s, from, at - 1)
    from = at + 1
  end
end

local function good_name(n)
  return #n > 0 and #n <= 64 and string.match(n, '^[%w_%.%-]+$') ~= nil
end

-- The class parameters: a list of { name, F = {s, t}, C = {s, t}, M = {s, t} }, or nil when a
-- number does not parse (names are checked with the reports, as the allocator does).
local function parse_classes(str)
  local out = {}
  for _, part in ipairs(split(str, ';')) do
    local f = split(part, ',')
    if #f ~= 7 then return nil end
    local n = {}
    for i = 2, 7 do
      n[i] = int(f[i], MAXN)
      if n[i] == nil then return nil end
    end
    out[#out + 1] = { name = f[1], F = { n[2], n[3] }, C = { n[4], n[5] }, M = { n[6], n[7] } }
  end
  return out
end
local classes = parse_classes(cparams)
if classes == nil then return fail('BADARG', 'class parameters') end

-- Both keys are hashes of this format, or absent.
for k = 1, 2 do
  local t = redis.call('TYPE', KEYS[k])['ok']
  if t ~= 'hash' and t ~= 'none' then
    return fail('FOREIGN', 'key ' .. k .. ' is a ' .. t)
  end
end

-- The header, or nil when the store is empty.
local meta = nil
local raw = redis.call('HGETALL', KEYS[1])
if #raw > 0 then
  local m = {}
  for i = 1, #raw, 2 do m[raw[i]] = raw[i + 1] end
  if m['format'] ~= FORMAT then
    return fail('FOREIGN', 'meta format')
  end
  meta = { epoch = int(m['epoch'], MAXN), seq = int(m['seq'], MAXN),
           learning_until = int(m['learning_until'], MAXN), params = m['params'] }
  if meta.epoch == nil or meta.seq == nil or meta.learning_until == nil
      or type(meta.params) ~= 'string' then
    return fail('CORRUPT', 'meta')
  end
end

local function write_meta(m)
  redis.call('HSET', KEYS[1], 'format', FORMAT, 'epoch', m.epoch, 'seq', m.seq,
    'learning_until', m.learning_until, 'params', m.params)
end

if op == 'release' then
  if as + at + hs + ht > 0 then return fail('REFUSED', 'NotDrained') end
  if meta == nil then return 0 end
  if meta.params ~= params then return fail('REFUSED', 'ConfigMismatch') end
  if redis.call('HDEL', KEYS[2], rid) == 1 then
    meta.seq = meta.seq + 1
    write_meta(meta)
  end
  return 0
end

-- check_request
for _, v in ipairs({ as, at, hs, ht, ws, wt, gs, gt, fs, ft }) do
  if v > MAXA then return fail('REFUSED', 'AboveGlobal') end
end
if ws > gs or wt > gt then return fail('REFUSED', 'AboveGlobal') end

-- check_classes: one report per class parameter, in their order, within the limits.
local uses = {}
for _, part in ipairs(split(ARGV[19] or '', ';')) do
  local f = split(part, ':')
  if #f ~= 9 then return fail('BADARG', 'class report') end
  local u = { name = f[1] }
  for i = 2, 9 do
    u[i - 1] = int(f[i], MAXN)
    if u[i - 1] == nil then return fail('BADARG', 'class report') end
  end
  uses[#uses + 1] = u
end
if #uses ~= #classes then return fail('REFUSED', 'UnknownClass') end
local sfs, sft = 0, 0
for k, c in ipairs(classes) do
  local u = uses[k]
  if not good_name(c.name) or c.name ~= u.name then return fail('REFUSED', 'UnknownClass') end
  for _, v in ipairs({ c.F[1], c.F[2], c.C[1], c.C[2], c.M[1], c.M[2],
                       u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8] }) do
    if v > MAXA then return fail('REFUSED', 'AboveGlobal') end
  end
  if c.M[1] > c.F[1] or c.M[2] > c.F[2] or c.F[1] > c.C[1] or c.F[2] > c.C[2]
      or c.C[1] > gs or c.C[2] > gt then
    return fail('REFUSED', 'AboveGlobal')
  end
  sfs, sft = sfs + c.F[1], sft + c.F[2]
  if u[7] > c.C[1] or u[8] > c.C[2] then return fail('REFUSED', 'AboveClassLimit') end
end
if sfs > gs or sft > gt or #classes > MAX_CLASSES then return fail('REFUSED', 'AboveGlobal') end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + idiv(tonumber(time[2]), 1000)

-- header
if meta == nil then
  meta = { epoch = max(now, 1), seq = 0, learning_until = now + hold, params = params }
end
-- A class the table was not created with is named as such before the parameters differ.
do
  local at = string.find(meta.params, '|', 1, true)
  local known = {}
  if at ~= nil then
    for _, part in ipairs(split(string.sub(meta.params, at + 1), ';')) do
      known[split(part, ',')[1] or ''] = true
    end
  end
  for _, u in ipairs(uses) do
    if not known[u.name] then return fail('REFUSED', 'UnknownClass') end
  end
end
if meta.params ~= params then return fail('REFUSED', 'ConfigMismatch') end
local lost = repoch ~= 0 and (repoch ~= meta.epoch or rseq > meta.seq)
if lost and as + at + hs + ht > 0 then
  meta.learning_until = max(meta.learning_until, now + hold)
end

-- The other live records; expired ones are dropped once every check passed.
local recs = redis.call('HGETALL', KEYS[2])
local live, expired = {}, {}
for i = 1, #recs, 2 do
  local id, v = recs[i], recs[i + 1]
  local parts = split(v, ';')
  if #parts ~= #classes + 1 then return fail('CORRUPT', 'record') end
  local f, n = {}, 0
  for x in string.gmatch(parts[1], '[^:]+') do
    n = n + 1
    f[n] = int(x, MAXN)
    if f[n] == nil then return fail('CORRUPT', 'record') end
  end
  if n ~= 9 then return fail('CORRUPT', 'record') end
  f.classes = {}
  for k = 1, #classes do
    local cf = split(parts[k + 1], ':')
    if #cf ~= 12 then return fail('CORRUPT', 'class record') end
    for j = 1, 12 do
      cf[j] = int(cf[j], MAXN)
      if cf[j] == nil then return fail('CORRUPT', 'class record') end
    end
    f.classes[k] = cf
  end
  if f[9] + hold <= now then
    expired[#expired + 1] = id
  elseif id ~= rid then
    live[#live + 1] = f
  end
end
if #live >= MAX_REPLICAS then return fail('REFUSED', 'TooManyReplicas') end

local os_, ot = 0, 0
for _, f in ipairs(live) do
  os_ = os_ + max(max(f[1], f[3]), f[5])
  ot = ot + max(max(f[2], f[4]), f[6])
end
local avs, avt = max(gs - os_, 0), max(gt - ot, 0)
-- A format-1 table under KEYS[3] (a hash not yet marked with this format) may hold shares this
-- table does not count: learn for ttl + quarantine, which outlasts them, as after lost state.
local old = redis.call('TYPE', KEYS[3])['ok']
local mark = false
if old == 'hash' or old == 'none' then
  mark = redis.call('HGET', KEYS[3], 'format') ~= FORMAT
  if mark and old == 'hash' then
    meta.learning_until = max(meta.learning_until, now + hold)
  end
end
local learning = now < meta.learning_until

local function level(all, cap)
  local lo, hi = 0, cap
  while lo < hi do
    local mid = lo + idiv(hi - lo + 1, 2)
    local sum = 0
    for _, w in ipairs(all) do sum = sum + min(w, mid) end
    if sum <= cap then lo = mid else hi = mid - 1 end
  end
  return lo
end

local function fair(all, mine, cap)
  local sum = 0
  for _, w in ipairs(all) do sum = sum + w end
  if sum <= cap then
    return mine + idiv(cap - sum, #all)
  end
  return min(mine, level(all, cap))
end

local ts, tt
if learning then
  ts, tt = max(as, hs), max(at, ht)
else
  local ms, mt = max(ws, fs), max(wt, ft)
  local alls, allt = {}, {}
  for _, f in ipairs(live) do
    alls[#alls + 1] = max(f[7], fs)
    allt[#allt + 1] = max(f[8], ft)
  end
  alls[#alls + 1] = ms
  allt[#allt + 1] = mt
  ts, tt = fair(alls, ms, gs), fair(allt, mt, gt)
end
local grs, grt = min(ts, avs), min(tt, avt)

-- classes.rs `split`: per class and resource (r = 1 slots, 2 tokens). A class record's
-- reservation: floor max(applied, granted), ceiling max(applied, granted, held).
-- Class record fields: 1-2 applied floor, 3-4 applied ceiling, 5-6 granted floor,
-- 7-8 granted ceiling, 9-10 held, 11-12 wants; a report u: 1-2 applied floor,
-- 3-4 applied ceiling, 5-6 held, 7-8 wants.
local share = { grs, grt }
local cgrants = {}
for k, c in ipairs(classes) do
  local u = uses[k]
  -- One limit of class k (`limit`; `reserved(x)` the reservation of it in another replica's
  -- class record x), resource r: the fair target (while learning, what the replica keeps,
  -- `kept`), capped by what the others leave.
  local function grant(r, limit, reserved, kept)
    local taken = 0
    for _, f in ipairs(live) do taken = taken + reserved(f.classes[k]) end
    local target = kept
    if not learning then
      local mine = max(u[6 + r], c.M[r])
      local all = {}
      for _, f in ipairs(live) do all[#all + 1] = max(f.classes[k][10 + r], c.M[r]) end
      all[#all + 1] = mine
      target = fair(all, mine, limit)
    end
    return min(target, max(limit - taken, 0))
  end
  local g = {}
  for r = 1, 2 do
    g[r] = grant(r, c.F[r], function(x) return max(x[r], x[4 + r]) end, u[r])
    local glob = (r == 1) and gs or gt
    if c.C[r] >= glob then
      g[2 + r] = share[r]
    else
      g[2 + r] = grant(r, c.C[r], function(x) return max(max(x[2 + r], x[6 + r]), x[8 + r]) end,
        max(u[2 + r], u[4 + r]))
    end
  end
  cgrants[k] = g
end
meta.seq = meta.seq + 1

-- Format 1's replicas meet a foreign format from now on and fail closed (KEYS[3] marked
-- below).

if mark then redis.call('HSET', KEYS[3], 'format', FORMAT) end
local rec = { table.concat({ as, at, grs, grt, hs, ht, ws, wt, now }, ':') }
for k, u in ipairs(uses) do
  local g = cgrants[k]
  rec[#rec + 1] = table.concat({ u[1], u[2], u[3], u[4], g[1], g[2], g[3], g[4],
                                 u[5], u[6], u[7], u[8] }, ':')
end
for _, id in ipairs(expired) do redis.call('HDEL', KEYS[2], id) end
redis.call('HSET', KEYS[2], rid, table.concat(rec, ';'))
write_meta(meta)
local reply = { grs, grt, meta.epoch, meta.seq, now, learning and 1 or 0 }
for _, g in ipairs(cgrants) do
  for j = 1, 4 do reply[#reply + 1] = g[j] end
end
return reply
