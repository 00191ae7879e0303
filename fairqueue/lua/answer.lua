-- A web that streamed a granted job's answer from the engine itself reports how it went
-- (scheduler/online/granted.py): to the worker that granted it (its inbox: the run it waits on
-- there ends with the report), and, when the answer was given whole, into the job's hash
-- while the job is kept, for a run that picks it again after that worker died (it then only
-- releases it). ARGV[4..]: job_id, the report (JSON), the worker's inbox ('' = none), '1' to
-- keep it in the job.
local job_id, report, inbox, keep = ARGV[4], ARGV[5], ARGV[6], ARGV[7] == '1'
if inbox ~= '' then
  redis.call('RPUSH', inbox, job_id .. ' ' .. report)
  redis.call('EXPIRE', inbox, KEEP)
end
if keep and redis.call('EXISTS', k_job(job_id)) == 1 then
  redis.call('HSET', k_job(job_id), 'answered', report)
end
return 1
