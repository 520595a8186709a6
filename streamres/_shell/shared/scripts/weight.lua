-- A model's weight for the fleet: ARGV[2] "failure" (x penalty) or "success" (a quarter of the
-- way back), from ARGV[3] base, [4] penalty, [5] restore, [6] floor; published on ARGV[7].
local w = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or ARGV[3])
local base, penalty, restore, floor = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]),
  tonumber(ARGV[6])
if ARGV[2] == 'failure' then
  w = math.max(base * floor, w * penalty)
else
  w = math.min(base, w + (base - w) * restore)
end
local exact = string.format('%.17g', w)  -- tostring and cjson would round to 14 digits
if w >= base then redis.call('HDEL', KEYS[1], ARGV[1]) else
  redis.call('HSET', KEYS[1], ARGV[1], exact)
end
redis.call('PEXPIRE', KEYS[1], 86400000)
redis.call('PUBLISH', ARGV[7],
  '{"kind":"weight","route":' .. cjson.encode(ARGV[1]) .. ',"weight":' .. exact .. '}')
return exact
