-- Housekeeping's nudge for a pool with waiting work, in case a message or a wake-up was
-- lost: wake an idle loop (no message), else ask for one to be summoned, once per
-- `summon_s` (see summon_loop). ARGV[4..]: pool, summon_s. Returns what summon_loop said.
return summon_loop(ARGV[4], ARGV[5])
