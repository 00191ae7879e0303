-- A running job generated past what its reservation covers (covered_tokens): its
-- reservation grows to cover as many tokens again (its worst case at most), on its engine
-- and, for a job whose growth is counted (`observed`), of its tenant's lease in the pool. A
-- growth is not checked against the engine's room nor the lease: the job runs already (only
-- the engine could stop it), and both hold the next picks back until they have room again.
-- ARGV[4..]: job_id, attempt, tokens (generated so far, its sequences together).
-- Returns the tokens the reservation covers now (-1: its worst case, it never grows again),
-- or -2 when the job is not this attempt's running job any more.
local job_id, attempt, tokens = ARGV[4], ARGV[5], tonumber(ARGV[6])
local names = {'state', 'attempt', 'reserved', 'held', 'kv_bytes', 'kv_floor', 'kv_token',
               'observed', 'tenant', 'engine'}
local values = redis.call('HMGET', k_job(job_id), unpack(names))
local job = {}
for i, name in ipairs(names) do job[name] = values[i] end
if job.state ~= 'running' or job.attempt ~= attempt then return -2 end
local covered = covered_tokens(job)
if covered < 0 or tokens <= covered then return covered end
local reserved = num(job.reserved)
local grown = math.min(num(job.kv_bytes), num(job.kv_floor) + 2 * tokens * num(job.kv_token))
if grown <= reserved then return covered end
local fields = {'reserved', int(grown)}
redis.call('HINCRBY', k_engine_use(job.engine), 'reserved', int(grown - reserved))
if job.observed == '1' then
  redis.call('HINCRBY', k_lease(job.tenant), 'held', int(grown - reserved))
  table.insert(fields, 'held')
  table.insert(fields, int(held_bytes(job) + grown - reserved))
end
redis.call('HSET', k_job(job_id), unpack(fields))
job.reserved = int(grown)
return covered_tokens(job)
