-- A shrink's first step, in the pool's slot: the tenant's lease there, KEYS[1]
-- (`{p:<pool>}:lease:<t>`), gives back what it holds beyond what its jobs hold + ARGV[1]
-- bytes (a margin), so the pool cannot use it any more. The tenant's slot then counts it
-- back (lease_settle); until then it counts more than is leased: under-used, never exceeded.
-- Returns {bytes given back, bytes leased now, the latest grant number applied or fenced}.
local lease = redis.call('HMGET', KEYS[1], 'leased', 'held', 'seq')
local leased, held = num(lease[1]), num(lease[2])
local given = math.max(0, leased - held - math.max(0, tonumber(ARGV[1])))
if given > 0 then
  leased = leased - given
  redis.call('HSET', KEYS[1], 'leased', int(leased))
  redis.call('HDEL', KEYS[1], 'asked_at')  -- a pick may ask again (lib.lua pick_on)
end
return {given, leased, num(lease[3])}
