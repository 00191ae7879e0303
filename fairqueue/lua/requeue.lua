-- Return a running job to the head of its tenant's queue (its worker gave it back, e.g.
-- the engine went away). ARGV[4..]: job_id, attempt ('' = any), reason, then the class
-- timeouts (interactive, standard, offline). Returns 1 when requeued, 0 when a no-op.
local job_id, attempt, reason = ARGV[4], ARGV[5], ARGV[6]
local job = hgetall(k_job(job_id))
if job.state ~= 'running' then return 0 end
if attempt ~= '' and attempt ~= job.attempt then return 0 end
requeue_running(job_id, job, timeouts_from(7), reason)
wake_idle_loop(job.pool)  -- it can run again, here or on another engine
return 1
