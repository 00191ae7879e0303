-- The tenant's quota and burst (bytes), in its slot, KEYS[1] (`{t:<t>}:quota`). ARGV:
-- quota, burst. Leases above a lowered quota stay until shrinks give them back; no grant is
-- made meanwhile (lease_grant).
redis.call('HSET', KEYS[1], 'quota', int(tonumber(ARGV[1])), 'burst', int(tonumber(ARGV[2])))
return 1
