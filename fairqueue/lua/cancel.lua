-- Cancel a queued or running job; everything it holds is freed and its waiter told.
-- A running job is charged its prompt only: the output it produced is unknown here (a
-- worker that knows it calls release instead).
-- ARGV[4..]: job_id, reason
-- Returns the state the job was in ('queued' / 'running'), or '' when there was nothing to do.
local job_id, reason = ARGV[4], ARGV[5]
local job = hgetall(k_job(job_id))
if job.state == 'queued' then
  unqueue(job_id, job)
elseif job.state == 'running' then
  free_running(job_id, job)
  recharge(job_id, job, token_charge(job, num(job.prompt_tokens), 0))
  wake_idle_loop(job.pool)  -- its seat is free for the next job
else
  return ''
end
finish(job_id, 'cancelled', reason)
emit(job_id, {event = 'cancelled', reason = reason})
return job.state
