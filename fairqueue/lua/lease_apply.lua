-- A grant (lease_grant) reaches its pool: the tenant's lease in the pool's slot, KEYS[1]
-- (`{p:<pool>}:lease:<t>`), grows by it. ARGV: bytes, the grant's number. A grant numbered no
-- higher than the latest applied or fenced (lease_fence) is refused: it came late, and its
-- bytes stay counted by the tenant's slot alone (under-used, never exceeded) until a settle.
-- Returns 1 when applied, 0 when refused.
local granted, seq = tonumber(ARGV[1]), tonumber(ARGV[2])
if granted <= 0 or seq <= num(redis.call('HGET', KEYS[1], 'seq')) then return 0 end
redis.call('HINCRBY', KEYS[1], 'leased', int(granted))
redis.call('HSET', KEYS[1], 'seq', int(seq))
redis.call('HDEL', KEYS[1], 'asked_at')  -- a pick may ask again (lib.lua pick_on)
return 1
