-- One half-open probe across the processes: -1 if this one claimed it, else the ms left on
-- the other's claim — or on the model's reopened circuit (KEYS[2] field ARGV[3], a wall-clock
-- time): the probe that reopened it frees its claim just after, and another process must not
-- take the claim before that news reaches it.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local open = tonumber(redis.call('HGET', KEYS[2], ARGV[3]) or '0')
if open > now then return math.ceil((open - now) * 1000) end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return -1 end
return redis.call('PTTL', KEYS[1])
