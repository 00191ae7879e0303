-- A running job ended: free its reservation and charge its real tokens in place of the
-- estimate. Idempotent: a job that is not running (already released, cancelled, requeued)
-- or whose attempt is not the one given (a stale worker after a reap) is left alone.
-- ARGV[4..]: job_id, prompt_tokens, completion_tokens, attempt ('' = any)
-- Returns 1 when released, 0 when it was a no-op.
local job_id, attempt = ARGV[4], ARGV[7]
local prompt_tokens, completion_tokens = tonumber(ARGV[5]), tonumber(ARGV[6])
local job = hgetall(k_job(job_id))
if job.state ~= 'running' then return 0 end
if attempt ~= '' and attempt ~= job.attempt then return 0 end
free_running(job_id, job)
recharge(job_id, job, token_charge(job, prompt_tokens, completion_tokens))
redis.call('HSET', k_job(job_id), 'used_prompt_tokens', int(prompt_tokens),
  'used_completion_tokens', int(completion_tokens))
finish(job_id, 'done', 'released')
return 1
