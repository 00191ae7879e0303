-- A running job ended: free its reservation and charge its real tokens (release_job).
-- ARGV[4..]: job_id, prompt_tokens, completion_tokens, attempt ('' = any), then the run's
-- last words (tell_last_words): its final event, an outbox list and an entry for it, and its
-- time to first token in seconds ('' = none: it gave no token).
-- Returns 1 when released, 0 when it was a no-op. The freed seat wakes an idle dispatch
-- loop of the pool, if one waits (its worker does not pick next, as release_pick would).
local released, job = release_job(ARGV[4], ARGV[5], ARGV[6], ARGV[7],
  numor(ARGV[11], nil))
tell_last_words(ARGV[4], ARGV[8], ARGV[9], ARGV[10], job.inbox)
if released == 1 then wake_idle_loop(job.pool) end
return released
