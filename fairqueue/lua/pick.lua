-- Pick the fairest admissible job of a pool (see pick_on in lib.lua), reserve and lease it.
-- ARGV[4..]: pool, engine_id ('' = the pool's engine with the most room that can run one),
-- lease_s, then class weights (interactive, standard, offline), then the dispatch loop's
-- token, idle_s, starting and summon_s (see loop_from; token '' = not a loop), then
-- ask ('1': a tenant's lease that holds its fairest job back is asked for; '': such a job
-- is passed over).
-- Returns the job (its id, whether to summon a loop, its fields: pick_reply), false when
-- nothing may run now, or what a tenant's lease should grow by.
return pick_reply(ARGV[4], ARGV[5], ARGV[6] + 0, weights_from(7), loop_from(10),
  ARGV[14] == '1')
