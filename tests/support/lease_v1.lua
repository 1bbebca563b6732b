-- The lease script of format 1 as released, kept unchanged: the previous format that
-- tests/cluster_redis.rs and benches/cluster.rs run beside format 2 (src/cluster/lease.lua).
-- llm-bulkhead lease table, format 1. The same algorithm as src/cluster/allocator.rs (`renew`,
-- `release`); tests/cluster_redis.rs checks that the two agree on random tables.
-- KEYS[1] meta hash, KEYS[2] leases hash (replica id -> "as:at:gs:gt:hs:ht:ws:wt:renewed_at").
-- ARGV: op, format, gs, gt, fs, ft, ttl, quarantine, replica, as, at, hs, ht, ws, wt, epoch, seq.
local FORMAT = 'llm-bulkhead-lease/1'
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
local params = table.concat({ ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8] }, ':')
local hold = ttl + quar

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

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + idiv(tonumber(time[2]), 1000)

-- header
if meta == nil then
  meta = { epoch = max(now, 1), seq = 0, learning_until = now + hold, params = params }
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
  local f, n = {}, 0
  for x in string.gmatch(v, '[^:]+') do
    n = n + 1
    f[n] = int(x, MAXN)
    if f[n] == nil then return fail('CORRUPT', 'record') end
  end
  if n ~= 9 then return fail('CORRUPT', 'record') end
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
meta.seq = meta.seq + 1

for _, id in ipairs(expired) do redis.call('HDEL', KEYS[2], id) end
redis.call('HSET', KEYS[2], rid, table.concat({ as, at, grs, grt, hs, ht, ws, wt, now }, ':'))
write_meta(meta)
return { grs, grt, meta.epoch, meta.seq, now, learning and 1 or 0 }
