-- A job of the tenant that held ARGV[1] bytes in the pool ended: its lease, KEYS[1]
-- (`{p:<pool>}:lease:<t>`), holds that much less (never below 0). Returns what it holds now.
local held = math.max(0, num(redis.call('HGET', KEYS[1], 'held')) - tonumber(ARGV[1]))
redis.call('HSET', KEYS[1], 'held', int(held))
return held
