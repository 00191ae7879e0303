-- A pool's answer about the tenant's lease there (lease_shrink, lease_fence), in the
-- tenant's slot, KEYS[1] (`{t:<t>}:quota`). ARGV: pool, the bytes the pool leases, the
-- latest grant number it applied or fenced. A pool's lease grows only by a grant applied, so
-- while the pool's number is still the tenant's latest one there, the pool leases at most
-- what it answered: the count drops to it (it never rises). With another number a grant is
-- on its way, and the count stays. Returns the bytes counted leased to the pool now.
local pool, leased, seq = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local slot = redis.call('HMGET', KEYS[1], 'lease:' .. pool, 'seq:' .. pool)
local counted = num(slot[1])
if seq == num(slot[2]) and leased < counted then
  counted = leased
  redis.call('HSET', KEYS[1], 'lease:' .. pool, int(counted))
end
return counted
