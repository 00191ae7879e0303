-- A job of the tenant that holds ARGV[1] bytes of its quota runs in the pool while what the
-- tenant's jobs hold there stays within the pool's lease, KEYS[1] (`{p:<pool>}:lease:<t>`):
-- held + cost <= leased. The tenant's slot is not needed. Returns 1 when admitted, else 0.
local cost = tonumber(ARGV[1])
local lease = redis.call('HMGET', KEYS[1], 'leased', 'held')
if num(lease[2]) + cost > num(lease[1]) then return 0 end
redis.call('HINCRBY', KEYS[1], 'held', int(cost))
return 1
