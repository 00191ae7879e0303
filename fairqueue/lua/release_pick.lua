-- A worker's turn in one step: release the job it ran, then pick its next one. Saves the
-- worker a round trip per job, and Redis one script start.
-- ARGV[4..]: job_id, prompt_tokens, completion_tokens, attempt ('' = any), then as pick.lua:
-- pool, engine_id ('' = any), lease_s, class weights, the dispatch loop's arguments; then
-- the run's last words (tell_last_words): its final event, an outbox list, an entry for it,
-- and its time to first token in seconds ('' = none).
-- Returns {released (1/0), next job as JSON or false}.
tell_last_words(ARGV[4], ARGV[18], ARGV[19], ARGV[20])
local released = release_job(ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7],
  tonumber(ARGV[21]))
local next_job = pick_reply(ARGV[8], ARGV[9], tonumber(ARGV[10]), weights_from(11),
  loop_from(14))
if type(next_job) == 'table' then return next_job end  -- an error reply
return {released, next_job}
