-- Remove queued jobs whose queue deadline has passed and tell their waiters why.
-- ARGV[4]: limit. Returns the expired job ids.
local limit = tonumber(ARGV[4])
local expired = {}
for _, job_id in ipairs(redis.call('ZRANGEBYSCORE', k_waiting(), '-inf', fmt(NOW), 'LIMIT', 0, limit)) do
  local job = hgetall(k_job(job_id))
  if job.state == 'queued' then
    expire_queued(job_id, job)
    table.insert(expired, job_id)
  else
    redis.call('ZREM', k_waiting(), job_id)
  end
end
return expired
