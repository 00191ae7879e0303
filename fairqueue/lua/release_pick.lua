-- A worker's turn in one step: release the job it ran, then pick its next one. Saves the
-- worker a round trip per job, and Redis one script start.
-- ARGV[4..]: job_id, prompt_tokens, completion_tokens, attempt ('' = any), then as pick.lua:
-- pool, engine_id ('' = any), lease_s, class weights, the dispatch loop's arguments; then
-- the run's last words (tell_last_words): its final event, an outbox list, an entry for it,
-- and its time to first token in seconds ('' = none); then same_engine ('1': pick for the
-- engine the released job ran on, whatever engine_id says).
-- Returns {released (1/0), the next job (pick_reply's array), false, or what a tenant's
-- lease should grow by (pick_reply: the caller asks for it, then picks with pick.lua)}.
--
-- The engine a release frees room on is the one place where room appeared, so a worker's
-- turn picks for it alone (same_engine): a pick then reads one engine's hashes, not every
-- engine's of the pool. Room that appears elsewhere (a job cancelled or requeued, a policy
-- or load that changed) wakes a waiting loop, whose pick looks at every engine; housekeeping's
-- kick (every GPUSHARE_HOUSEKEEPING_INTERVAL_S) finds whatever else is left. An engine no
-- longer in the pool gets nothing (false), not an error.
local released, job, engine = release_job(ARGV[4], ARGV[5], ARGV[6], ARGV[7],
  numor(ARGV[21], nil))
tell_last_words(ARGV[4], ARGV[18], ARGV[19], ARGV[20], job.inbox)
local engine_id, ran_on = ARGV[9], job.engine
if ARGV[22] ~= '1' then
  engine = nil
else
  -- As it is after the release, which moved its seat controller and freed its room.
  engine = engine or ran_on and ran_on ~= '' and hgetall(k_engine(ran_on)) or {}
  if engine.pool ~= ARGV[8] then return {released, false} end
  engine_id = ran_on
end
local next_job = pick_reply(ARGV[8], engine_id, ARGV[10] + 0, weights_from(11),
  loop_from(14), true, engine)
if type(next_job) == 'table' and next_job.err then return next_job end  -- an error reply
return {released, next_job}
