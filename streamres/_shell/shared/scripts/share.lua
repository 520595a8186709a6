-- Keep the later "refused until" of a model (or, ARGV[5] = "clear", forget it: the model
-- recovered), and tell everyone.
if ARGV[5] == 'clear' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  local cur = redis.call('HGET', KEYS[1], ARGV[1])
  if (not cur) or tonumber(cur) < tonumber(ARGV[2]) then
    redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  end
  redis.call('PEXPIRE', KEYS[1], 86400000)
end
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
