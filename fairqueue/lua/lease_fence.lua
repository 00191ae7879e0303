-- A reconciliation's step in each pool: grants to the tenant's lease there, KEYS[1]
-- (`{p:<pool>}:lease:<t>`), numbered up to ARGV[1] (the tenant's latest, lease_sequences)
-- are applied already or refused from now on (lease_apply), so a grant lost on its way (a
-- crash between grant and apply) stops holding the tenant's count up once this answer is
-- settled (lease_settle). Returns {bytes leased, the latest number applied or fenced}.
local lease = redis.call('HMGET', KEYS[1], 'leased', 'seq')
local seq = num(lease[2])
if tonumber(ARGV[1]) > seq then
  seq = tonumber(ARGV[1])
  redis.call('HSET', KEYS[1], 'seq', int(seq))
end
return {num(lease[1]), seq}
