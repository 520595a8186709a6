-- The retry budget as one token bucket for every process (``_balance.RetryBudget``'s rules,
-- the cap growing with the fleet's recent first attempts, Redis's clock): ARGV[1] "deposit"
-- (ARGV[7] first attempts), "refund", or "reserve" (returns the seconds until the reserved
-- token is there; -1: never); ARGV[2..6]: ratio, floor, cap, initial balance, window.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ratio, floor, cap = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local window = tonumber(ARGV[6])
local b = redis.call('HMGET', KEYS[1], 'balance', 'updated', 'recent')
local balance = tonumber(b[1]) or tonumber(ARGV[5])
local updated = tonumber(b[2]) or now
local recent = tonumber(b[3]) or 0
if now > updated then
  recent = recent * math.exp(-(now - updated) / window)
  balance = math.min(math.max(cap, ratio * recent), balance + (now - updated) * floor)
  updated = now
end
local out = 0
if ARGV[1] == 'deposit' then
  local n = tonumber(ARGV[7] or '1')
  recent = recent + n
  balance = math.min(math.max(cap, ratio * recent), balance + ratio * n)
elseif ARGV[1] == 'refund' then
  balance = math.min(math.max(cap, ratio * recent), balance + 1)
else
  balance = balance - 1
  if balance < 0 then
    if floor <= 0 then out = -1 else out = -balance / floor end
  end
end
redis.call('HSET', KEYS[1], 'balance', tostring(balance), 'updated', tostring(updated),
  'recent', tostring(recent))
redis.call('EXPIRE', KEYS[1], 86400)
return tostring(out)
