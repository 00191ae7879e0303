-- A dispatch loop's wait for a wake-up timed out: it leaves the idle loops. A wake-up that
-- came just after the timeout is not lost: it is taken here, and the loop picks again.
-- ARGV[4..]: pool, token. Returns 1 when the loop was woken meanwhile, else 0.
redis.call('ZREM', k_idle_loops(ARGV[4]), ARGV[5])
local woken = redis.call('LPOP', k_loop_wake(ARGV[5]))
redis.call('DEL', k_loop_wake(ARGV[5]))
if woken then return 1 end
return 0
