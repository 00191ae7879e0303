-- Return running jobs whose lease has expired to the head of their queues and free their
-- reservations. ARGV[4..]: limit, then the class timeouts. Returns the reaped job ids.
local limit = tonumber(ARGV[4])
local timeouts = timeouts_from(5)
local reaped = {}
for _, job_id in ipairs(redis.call('ZRANGEBYSCORE', k_inflight(), '-inf', fmt(NOW), 'LIMIT', 0, limit)) do
  local job = hgetall(k_job(job_id))
  if job.state == 'running' then
    requeue_running(job_id, job, timeouts, 'lease_expired')
    wake_idle_loop(job.pool)
    table.insert(reaped, job_id)
  else
    redis.call('ZREM', k_inflight(), job_id)
  end
end
return reaped
