-- Extend the lease of a running job (the worker's heartbeat while it streams).
-- ARGV[4..]: job_id, attempt, lease_s. Returns 1 when renewed, 0 when the job is no
-- longer this worker's (reaped, cancelled, released): the worker should stop.
local job_id, attempt, lease_s = ARGV[4], ARGV[5], tonumber(ARGV[6])
local job = hgetall(k_job(job_id))
if job.state ~= 'running' or job.attempt ~= attempt then return 0 end
local lease_deadline = NOW + lease_s
redis.call('HSET', k_job(job_id), 'lease_deadline', fmt(lease_deadline))
redis.call('ZADD', k_inflight(), 'XX', fmt(lease_deadline), job_id)
return 1
