-- Leases up to ARGV[2] bytes of the tenant's quota to pool ARGV[1], in the tenant's slot,
-- KEYS[1] (`{t:<t>}:quota`): while the leases together stay within the quota, or within
-- quota + burst when ARGV[3] is '1' (the pool has idle capacity). Each grant to a pool takes
-- the next number of the pool's sequence: the pool applies a grant only above the latest
-- number it applied (lease_apply), which is what makes a settle exact (lease_settle).
-- Returns {bytes granted, the grant's number}; {0, 0}: none, nothing to apply.
local pool, want, idle = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1'
local slot = hgetall(KEYS[1])
local total = 0
for name, value in pairs(slot) do
  if string.sub(name, 1, 6) == 'lease:' then total = total + num(value) end
end
local limit = num(slot.quota)
if idle then limit = limit + num(slot.burst) end
local granted = math.min(math.max(0, want), math.max(0, limit - total))
if granted <= 0 then return {0, 0} end
redis.call('HINCRBY', KEYS[1], 'lease:' .. pool, int(granted))
return {granted, redis.call('HINCRBY', KEYS[1], 'seq:' .. pool, 1)}
