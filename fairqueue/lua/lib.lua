-- Shared helpers: the first part of the fair queue's Redis Functions library (library.py
-- builds it: this file, then one function per script file, each running `begin` on its
-- arguments and then its file's body). Redis runs the library's top level once, when it is
-- loaded, and a call only its own function: the helpers below are not made again per call.
-- A call's one key, KEYS[1], is its pool's tag prefix (`<prefix>{p:<pool>}:`, keys.py
-- `Keys.pool_tag`): every key it touches is of that slot, and a cluster routes the call by
-- it. ARGV[1] is the key prefix, ARGV[2] the current time (seconds; empty: Redis's own
-- clock), ARGV[3] the time to keep a finished job and its event list (seconds). Script
-- arguments start at ARGV[4]. Key names mirror keys.py one for one.
--
-- The quota leases' functions (lease_*.lua) take their keys whole instead: each touches
-- only the keys its call declares, KEYS, all of one hash slot (a tenant's `{t:<t>}` or a
-- pool's `{p:<p>}`); `begin_keyed` sets KEYS and ARGV, and their arguments start at ARGV[1].
--
-- KEYS, ARGV, P, T, KEEP, NOW, LEFT_BACKLOG, NOW_S and TAGS belong to the call running now:
-- Redis runs one call at a time, and each call sets them first (`begin`, `begin_keyed`), so
-- no call sees another's. LEFT_BACKLOG counts the tenants each backlog lost in the call
-- (leave_backlog), by which a scan of a backlog in pages finds its next page (backlogged).
-- NOW_S (NOW as written: now_s) and TAGS (the pools' key prefixes: tag) are made once per
-- call, where it first needs them: formatting a number, or joining strings, costs more than
-- the table lookup that reuses it.
local KEYS, ARGV, P, T, KEEP, NOW, LEFT_BACKLOG, NOW_S, TAGS

local function begin(keys, argv)
  KEYS = keys
  LEFT_BACKLOG, NOW_S, TAGS = {}, nil, {}
  T = keys[1]
  ARGV = argv
  P = argv[1]
  KEEP = argv[3]  -- a string: a number given to a command would be formatted again
  -- Redis's clock by default: web and worker hosts then share one time, so leases and
  -- queue deadlines do not depend on their clocks agreeing. Tests pass their own.
  if argv[2] == '' then
    local clock = redis.call('TIME')
    NOW = clock[1] + clock[2] / 1000000
  else
    NOW = argv[2] + 0
  end
end

local function begin_keyed(keys, argv)
  KEYS = keys
  LEFT_BACKLOG, NOW_S, TAGS = {}, nil, {}
  ARGV = argv
end

local CLASSES = {'interactive', 'standard', 'offline'}
-- How long a tenant's latest answer lengths in a pool stay after its last answer there: a
-- tenant back after a pause is predicted from them, not reserved its worst case again.
local SAMPLES_KEEP_S = 24 * 3600
local SAMPLES_KEEP = '86400'  -- SAMPLES_KEEP_S, as a command's argument

-- Every key of a pool's decisions carries the pool's hash tag, `{p:<pool>}`: T (the call's
-- KEYS[1], `<prefix>{p:<pool>}:`) starts them all, so a call touches one slot. The keys that
-- name a pool build the same prefix from it (the call's pool, whose tag T is).
local function tag(pool)
  local prefix = TAGS[pool]
  if not prefix then
    prefix = P .. '{p:' .. pool .. '}:'
    TAGS[pool] = prefix
  end
  return prefix
end
local function k_job(id) return T .. 'job:' .. id end
local function k_events(id) return T .. 'job:' .. id .. ':events' end
local function k_queue(pool, cls, tenant) return tag(pool) .. 'q:' .. cls .. ':' .. tenant end
local function k_backlog(pool, cls) return tag(pool) .. 'backlog:' .. cls end
local function k_counters(pool, cls) return tag(pool) .. 'vtc:' .. cls end
local function k_seated(pool, cls) return tag(pool) .. 'vtcseated:' .. cls end
local function k_clock(pool) return tag(pool) .. 'cvt' end
local function k_tenant(t) return T .. 'tenant:' .. t end
-- The tenant's quota lease in the pool (leases.py): `leased` (bytes of its quota the pool
-- may hold), `held` (what its running jobs here hold), `seq` (the latest grant applied or
-- fenced), `asked_at` (when a pick last asked for more, until the lease changes: see
-- pick_on).
local function k_lease(t) return T .. 'lease:' .. t end
local function k_engine(e) return T .. 'engine:' .. e end
local function k_engine_use(e) return T .. 'engine:' .. e .. ':use' end
local function k_engine_ttfts(e, cls) return T .. 'engine:' .. e .. ':ttft:' .. cls end
local function k_out_lens(pool, t) return tag(pool) .. 'outlen:' .. t end
local function k_out_pred(pool) return tag(pool) .. 'outpred' end
local function k_pool_engines(pool) return tag(pool) .. 'engines' end
local function k_pool_shape(pool) return tag(pool) .. 'shape' end
local function k_affinity(pool) return tag(pool) .. 'affinity' end
local function k_queue_keys(pool, cls) return tag(pool) .. 'qkeys:' .. cls end
local function k_inflight() return T .. 'inflight' end
local function k_waiting() return T .. 'waiting' end
local function k_idle_loops(pool) return tag(pool) .. 'loops:idle' end
local function k_loop_summoned(pool) return tag(pool) .. 'loops:summoned' end
local function k_loop_wake(token) return T .. 'loop:' .. token .. ':wake' end

-- A missing hash field comes back as false, and an unset one may be ''. Every other value
-- read as a number is one the platform wrote as a number. `v + 0` converts it once;
-- tonumber() would convert it twice (it checks it is a number, then converts it).
local function num(v)
  if not v or v == '' then return 0 end
  return v + 0
end
-- As num, with `default` for a value that is missing or unset.
local function numor(v, default)
  if not v or v == '' then return default end
  return v + 0
end

-- Lua turns numbers into strings with 14 digits; counters and byte totals need all of them.
-- A whole number is written as an integer: the same digits, formatted several times faster.
local function fmt(x)
  if x == math.floor(x) and x > -1e15 and x < 1e15 then return string.format('%d', x) end
  return string.format('%.17g', x)
end
local function int(x) return string.format('%d', x) end
local function now_s()
  if not NOW_S then NOW_S = fmt(NOW) end
  return NOW_S
end
-- The negative of a count the scripts wrote with int() ('' or false: 0), without turning it
-- into a number and back.
local function negated(count)
  if not count or count == '' or count == '0' then return '0' end
  if string.byte(count, 1) == 45 then return string.sub(count, 2) end  -- '-'
  return '-' .. count
end

local function hgetall(key)
  local flat = redis.call('HGETALL', key)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end

-- The fields of a job that a pick reads (live_head, held_here) and answers (pick_reply), in
-- the order it answers them: the worker reads them by place (queue.py PICK_FIELDS). Its
-- summary, inbox and counts are not read: every value read is copied into Lua and hashed.
local PICK_FIELDS = {'tenant', 'pool', 'cls', 'prompt_tokens', 'max_tokens', 'kv_bytes',
  'payload', 'state', 'enqueued_at', 'deadline', 'engine', 'attempt', 'lease_deadline',
  'charged', 'reason', 'answered', 'seqs', 'stamp', 'reserved', 'kv_floor', 'kv_token',
  'affinity', 'observed'}
local function read_job(job_id)
  local values = redis.call('HMGET', k_job(job_id), unpack(PICK_FIELDS))
  local job = {}
  for i, name in ipairs(PICK_FIELDS) do job[name] = values[i] or nil end
  return job
end

-- A job's events go to its waiter's inbox when it has one (a web process's list, read for
-- all of its waiters at once: each entry is '<job id> <event>'), else to the job's own list.
-- `inbox`: the job's `inbox` field where the caller has read it (false: it has none).
local function emit_raw(job_id, raw, inbox)
  if inbox == nil then inbox = redis.call('HGET', k_job(job_id), 'inbox') end
  if inbox and inbox ~= '' then
    redis.call('RPUSH', inbox, job_id .. ' ' .. raw)
    redis.call('EXPIRE', inbox, KEEP)
    return
  end
  redis.call('RPUSH', k_events(job_id), raw)
  redis.call('EXPIRE', k_events(job_id), KEEP)
end

local function emit(job_id, event)
  event.at = NOW
  emit_raw(job_id, cjson.encode(event))
end

-- A run's last words, told in the step that releases it (a round trip each, saved): its
-- final event for the waiter (JSON, '' = none) and an entry for an outbox list of the
-- pool's slot (the usage ledger's, `{p:<pool>}:ledger`; '' = none). Told whether or not the
-- release is a no-op: the waiter and the ledger hear a run's end as they would if the worker
-- told them in a step of its own.
local function tell_last_words(job_id, event, outbox, entry, inbox)
  if event ~= '' then emit_raw(job_id, event, inbox) end
  if entry ~= '' then redis.call('RPUSH', outbox, entry) end
end

-- The tenant's counter, and as it is written ('0' where it has none).
local function get_counter(pool, cls, tenant)
  local written = redis.call('HGET', k_counters(pool, cls), tenant)
  if not written then return 0, '0' end
  return num(written), written
end

-- XX: a tenant's score in the backlog follows its counter only while it is backlogged.
local function set_counter(pool, cls, tenant, value)
  local written = fmt(value)
  redis.call('HSET', k_counters(pool, cls), tenant, written)
  redis.call('ZADD', k_backlog(pool, cls), 'XX', written, tenant)
end

-- A tenant whose queue just became non-empty joins the backlog with its counter lifted, so
-- time spent idle is not banked as credit to be spent later in a burst: to the least
-- backlogged counter, and never below the stamp of the latest job its class ran to the end
-- (`seated`: where the engine's service has got to). With nobody backlogged, the stamp alone
-- bounds it: the engines hold jobs the fair queue no longer sees, ordered by their stamps
-- (`engine_priority`), and a tenant that sent less than its share keeps its place among them.
local function join_backlog(pool, cls, tenant)
  local backlog = k_backlog(pool, cls)
  local least = redis.call('ZRANGE', backlog, '0', '0', 'WITHSCORES')
  local target = num(redis.call('GET', k_seated(pool, cls)))
  if #least > 0 and least[2] + 0 > target then target = least[2] + 0 end
  local counter = get_counter(pool, cls, tenant)
  if counter < target then counter = target end
  local written = fmt(counter)
  redis.call('HSET', k_counters(pool, cls), tenant, written)
  redis.call('ZADD', backlog, written, tenant)
end

local function leave_backlog(pool, cls, tenant)
  local key = k_backlog(pool, cls)
  LEFT_BACKLOG[key] = (LEFT_BACKLOG[key] or 0) + redis.call('ZREM', key, tenant)
end

-- `{p:<pool>}:qkeys:<cls>` says, per tenant, the affinity key every job in its queue of the
-- class carries, or '*' where they may differ: a pick looking past the fairest tenant for a
-- job whose prefix its engine holds (pick_on, AFFINITY_SCAN) passes over a tenant whose key
-- another engine holds without reading its queue. Every job joins a queue here, so what it
-- says holds while the queue is not empty; a queue that empties leaves its field, which the
-- next job to join it writes again. `key`: the job's affinity key ('' = none; nil = not
-- known, as if the keys differed).
local function queue_job(job_id, pool, cls, tenant, at_head, key)
  local queue = k_queue(pool, cls, tenant)
  local length
  if at_head then
    length = redis.call('LPUSH', queue, job_id)
  else
    length = redis.call('RPUSH', queue, job_id)
  end
  key = key or '*'
  local keys = k_queue_keys(pool, cls)
  if length == 1 then
    redis.call('HSET', keys, tenant, key)
    join_backlog(pool, cls, tenant)
  else
    local known = redis.call('HGET', keys, tenant)
    if known ~= key and known ~= '*' then redis.call('HSET', keys, tenant, '*') end
  end
end

local function unqueue(job_id, job)
  local queue = k_queue(job.pool, job.cls, job.tenant)
  redis.call('LREM', queue, '1', job_id)
  redis.call('ZREM', k_waiting(), job_id)
  if redis.call('LLEN', queue) == 0 then leave_backlog(job.pool, job.cls, job.tenant) end
end

-- Moves the tenant's counter by the difference between a new charge and what the job was
-- charged so far (the estimate at pick). Returns the new charge as the job hash stores it:
-- callers write it with their own HSET of the job (one write per step, not one per field).
-- `counter`: the tenant's counter, where the caller has just read it.
local function move_counter(job, new_charge, counter)
  local delta = new_charge - num(job.charged)
  if delta ~= 0 then
    counter = counter or get_counter(job.pool, job.cls, job.tenant)
    set_counter(job.pool, job.cls, job.tenant, counter + delta)
  end
  return fmt(new_charge)
end

local function recharge(job_id, job, new_charge)
  redis.call('HSET', k_job(job_id), 'charged', move_counter(job, new_charge))
end

-- Real tokens as VTC charges them: output costs twice what input does.
local function token_charge(job, prompt_tokens, completion_tokens)
  local weight = num(job.charge_weight)
  if weight <= 0 then weight = 1 end
  return (prompt_tokens + 2 * completion_tokens) / weight
end

-- The engine's seats a job takes: one per sequence it runs (n samples of each of its
-- prompts; a job from before `seqs` existed takes one).
local function seats(job)
  local n = num(job.seqs)
  if n < 1 then return 1 end
  return n
end

-- KV reservations (docs/ARCHITECTURE.md, Reserving KV; tests/fairqueue/test_reservation.py
-- checks each rule below). A job reserves `reserved` bytes on its engine and holds `held`
-- bytes of its tenant's quota. An engine in the `worst` mode (the default here; the
-- platform's settings choose `predict`) has
-- each job reserve and hold its worst case, `kv_bytes` (its prompts and every token it may
-- generate). In the `predict` mode a job reserves its prompts (`kv_floor`) and the output
-- its tenant's answers in the pool have reached at quantile `out_quantile` (per sequence,
-- and never more than it may generate), and grows while it generates past that (grow.lua).
-- A tenant with too few answers seen yet reserves the worst case. A job whose tokens nobody
-- counts as they come (not streamed: `observed` unset) cannot grow: it holds its worst case
-- of its tenant's quota, while the engine's water level covers its growth there. In this
-- mode a job is picked holding at most its tenant's quota + burst, so one that fits it with
-- its prompts alone can run (enqueue.lua). A tenant passes its quota + burst only by the
-- growth of its running jobs past their predictions, and is picked nothing meanwhile.
local OUT_SAMPLES = 64  -- the latest output lengths kept per pool and tenant
local OUT_MIN_SAMPLES = 8  -- fewer: the worst case is reserved
local OUT_LAST = '63'  -- OUT_SAMPLES - 1, as a command's argument

-- What a job picked for `engine` reserves there and holds of its tenant's quota (`ceiling`:
-- its quota + burst), in bytes, and the tokens it is expected to generate (its sequences'
-- together: what the pick charges its tenant's counter until the release charges the real
-- ones).
local function job_cost(engine, job, ceiling)
  local worst, out = num(job.kv_bytes), num(job.max_tokens)
  local per_token = num(job.kv_token)
  if engine.reservation ~= 'predict' or per_token <= 0 then return worst, worst, out end
  local cost = worst
  local predicted = redis.call('HGET', k_out_pred(job.pool), job.tenant)
  if predicted then
    local n = seats(job)
    out = n * math.min(predicted + 0, math.floor(out / n))
    cost = math.min(worst, num(job.kv_floor) + out * per_token)
  end
  if job.observed == '1' then return cost, math.min(cost, ceiling), out end
  return cost, math.min(worst, ceiling), out
end

-- The KV an engine has free for picks. In the `predict` mode its budget is scaled down while
-- it preempts (`kv_scale`, set_load.lua), and what its jobs reserve counts with what the
-- engine's own measure of its KV in use (the water level) found beyond the reservations at
-- the last reading (`kv_excess_bytes`: growth nobody counted); a reading older than
-- KV_MEASURE_S counts for nothing.
local KV_MEASURE_S = 30
local function engine_free(engine, usage)
  local budget, used = num(engine.kv_budget_bytes), num(usage.reserved)
  if engine.reservation == 'predict' then
    budget = math.floor(budget * numor(engine.kv_scale, 1))
    if NOW - num(engine.kv_used_at) <= KV_MEASURE_S then
      used = used + num(engine.kv_excess_bytes)
    end
  end
  return budget - used
end

-- An answer's length per sequence, for its tenant's prediction in the pool: the latest
-- OUT_SAMPLES are kept, and their quantile `quantile` is the prediction once OUT_MIN_SAMPLES
-- are there. Kept SAMPLES_KEEP_S after the latest. Redis sorts them (SORT ... LIMIT: one
-- value back): in Lua, turning each into a number and sorting them cost four times as much.
-- Once the window is full, the list takes OUT_REFRESH - 1 more answers before it is cut
-- back to the latest OUT_SAMPLES and their quantile computed again: one answer moves the
-- quantile of the window by one place at most, and a sort per answer cost more than the rest
-- of the release.
local OUT_REFRESH = 8
local function observe_output(pool, tenant, per_seq, quantile)
  local key = k_out_lens(pool, tenant)
  local count = redis.call('LPUSH', key, int(per_seq))
  redis.call('EXPIRE', key, SAMPLES_KEEP)
  if count > OUT_SAMPLES then
    if count < OUT_SAMPLES + OUT_REFRESH then return end
    redis.call('LTRIM', key, '0', OUT_LAST)
    count = OUT_SAMPLES
  end
  if count < OUT_MIN_SAMPLES then return end
  local at = math.max(1, math.min(count, math.ceil(quantile * count)))
  local predicted = redis.call('SORT', key, 'LIMIT', int(at - 1), '1')[1]
  redis.call('HSET', k_out_pred(pool), tenant, predicted)
  redis.call('EXPIRE', k_out_pred(pool), SAMPLES_KEEP)
end

-- The tokens (its sequences' together) a running job's reservation covers, past which it
-- grows (grow.lua); -1: it reserves its worst case and never grows.
local function covered_tokens(job)
  local reserved, per_token = num(job.reserved), num(job.kv_token)
  if per_token <= 0 or reserved >= num(job.kv_bytes) then return -1 end
  return math.floor((reserved - num(job.kv_floor)) / per_token)
end

local function held_bytes(job)
  if job.held and job.held ~= '' then return num(job.held) end
  return num(job.reserved)
end

-- Gives back everything a running job holds: its bytes of its tenant's quota lease in the
-- pool and on the engine, its seats on the engine (a standard or offline job's are also
-- counted apart, in `standard` or `offline`: the seat bounds count them), its lease.
local function give_back(job_id, job)
  local held = job.held
  if not held or held == '' then held = job.reserved end  -- as held_bytes
  local use, seats_taken = k_engine_use(job.engine), negated(job.seqs)
  if seats_taken == '0' then seats_taken = '-1' end  -- as seats: at least one
  redis.call('HINCRBY', k_lease(job.tenant), 'held', negated(held))
  redis.call('HINCRBY', use, 'reserved', negated(job.reserved))
  redis.call('HINCRBY', use, 'inflight', seats_taken)
  if job.cls ~= 'interactive' then
    redis.call('HINCRBY', use, job.cls, seats_taken)
  end
  redis.call('ZREM', k_inflight(), job_id)
end

local function free_running(job_id, job)
  give_back(job_id, job)
  redis.call('HSET', k_job(job_id), 'reserved', '0', 'held', '0', 'lease_deadline', '')
end

-- A job that is over keeps its summary in place of its payload (the request's body can be
-- megabytes, kept for KEEP seconds for nothing).
local function drop_payload(job_id)
  local summary = redis.call('HGET', k_job(job_id), 'summary')
  if summary then
    redis.call('HSET', k_job(job_id), 'payload', summary)
    redis.call('HDEL', k_job(job_id), 'summary')
  end
end

local function finish(job_id, state, reason)
  redis.call('HSET', k_job(job_id), 'state', state, 'reason', reason, 'finished_at', now_s())
  drop_payload(job_id)
  redis.call('EXPIRE', k_job(job_id), KEEP)
end

local function expire_queued(job_id, job)
  unqueue(job_id, job)
  finish(job_id, 'expired', 'queue_timeout')
  emit(job_id, {event = 'expired', reason = 'queue_timeout',
                waited_s = NOW - num(job.enqueued_at), request_class = job.cls})
end

-- A running job goes back to the head of its tenant's queue: its reservation is freed and
-- its estimated charge refunded (it is charged again when picked again). It gets a fresh
-- queue deadline, since the wait that is over was not its fault.
local function requeue_running(job_id, job, timeouts, reason)
  free_running(job_id, job)
  recharge(job_id, job, 0)
  local deadline = NOW + timeouts[job.cls]
  redis.call('HSET', k_job(job_id), 'state', 'queued', 'engine', '', 'deadline', fmt(deadline))
  redis.call('ZADD', k_waiting(), fmt(deadline), job_id)
  queue_job(job_id, job.pool, job.cls, job.tenant, true, job.affinity)
  emit(job_id, {event = 'requeued', reason = reason})
end

local function timeouts_from(first)
  return {interactive = ARGV[first] + 0, standard = ARGV[first + 1] + 0,
          offline = ARGV[first + 2] + 0}
end

-- Seats by class (docs/ARCHITECTURE.md, Seats by class and latency targets). For a class
-- with a latency target, an engine bounds the seats the classes below it may hold: a fixed
-- bound the operator set (`fixed:<cls>`), else the controller's (`below:<cls>`), which moves
-- with each time to first token of the class measured there (observe_ttft). `model.py`
-- (SeatController, class_limit) states the same rules.
local MISS_WEIGHT = 4  -- the most a miss counts, in multiples of the miss at its target
local TTFT_SAMPLES = 200  -- the latest times to first token kept per engine and class
local TTFT_LAST = '199'  -- TTFT_SAMPLES - 1, as a command's argument

-- The seats the classes below `cls` hold on an engine now.
local function held_below(usage, cls)
  if cls == 'interactive' then return num(usage.standard) + num(usage.offline) end
  if cls == 'standard' then return num(usage.offline) end
  return 0
end

-- The seats the classes below `cls` may hold on the engine now; nil: no bound. The
-- controller's bound lapses once its class has gone `target_idle_s` without a measure:
-- nothing of the class runs there to protect.
local function seats_below(engine, cls)
  local fixed = engine['fixed:' .. cls]
  if fixed then return fixed + 0 end
  local below = engine['below:' .. cls]
  if not engine['target:' .. cls] or not below then return nil end
  if NOW - num(engine['sampled:' .. cls]) > num(engine.target_idle_s) then return nil end
  return math.max(1, math.floor(below + 0))
end

-- '' while a job of `cls` may take a seat of the engine, else the class whose bound holds it
-- back. As with all seats, a job is picked while one seat of the bound is free.
local function class_limit(engine, usage, cls)
  for _, above in ipairs(CLASSES) do
    if above == cls then return '' end
    local bound = seats_below(engine, above)
    if bound and held_below(usage, above) >= bound then return above end
  end
  return ''
end

-- A time to first token of class `cls` measured on an engine (seconds, the job's from its
-- arrival), for the controller of that class's target there: a hit grows the bound of the
-- classes below by step x (1 - q), a miss shrinks it by step x q (q: target_quantile), so the
-- bound settles where a share 1 - q of the class misses. A miss of a job picked after the
-- last cut shrinks it by as many times more as it was over the target (at most MISS_WEIGHT)
-- and marks a cut; the misses of jobs picked before it saw a larger bound and count once.
-- A miss while the bound is over the engine's seats first brings it down to them: a bound
-- above them limits only places in the engine's queue, where the class goes first anyway, not
-- the sequences it runs beside. The bound stays between 1 seat and all the seats and places;
-- a class measured again after an idle spell starts from all of them.
-- `engine` is the engine's hash as read in this call; the fields written are set in it too.
local function observe_ttft(engine_id, engine, cls, ttft, picked_at)
  local key = k_engine(engine_id)
  local f = {engine['target:' .. cls], engine['below:' .. cls], engine['cut:' .. cls],
    engine['sampled:' .. cls], engine.target_quantile, engine.target_step, engine.target_idle_s,
    engine.max_num_seqs, engine.queued}
  if not f[1] then return end
  local target, most = f[1] + 0, num(f[8]) + num(f[9])
  local samples = k_engine_ttfts(engine_id, cls)
  redis.call('LPUSH', samples, int(math.floor(ttft * 1000 + 0.5)))
  redis.call('LTRIM', samples, '0', TTFT_LAST)
  local below = numor(f[2], nil)
  if not below or NOW - num(f[4]) > num(f[7]) then below = most end
  local q, step, seats_total = num(f[5]), num(f[6]), num(f[8])
  local fields = {'sampled:' .. cls, now_s()}
  if ttft > target and below > seats_total then
    below = seats_total  -- above the seats it bounds only places in the engine's queue
  end
  if ttft <= target then
    below = below + step * (1 - q)
  elseif num(picked_at) > num(f[3]) then
    below = below - step * q * math.min(ttft / target, MISS_WEIGHT)
    table.insert(fields, 'cut:' .. cls)
    table.insert(fields, now_s())
  else
    below = below - step * q
  end
  below = math.min(most, math.max(1, below))
  table.insert(fields, 'below:' .. cls)
  table.insert(fields, fmt(below))
  redis.call('HSET', key, unpack(fields))
  for i = 1, #fields, 2 do engine[fields[i]] = fields[i + 1] end
end

-- A running job ended: free its reservation and charge its real tokens in place of the
-- estimate, in one write of the job hash. Idempotent: a job that is not running (already
-- released, cancelled, requeued) or whose attempt is not the one given ('' = any; a stale
-- worker after a reap) is left alone. Returns 1 when released, 0 when it was a no-op.
local RELEASE_FIELDS = {'state', 'attempt', 'reserved', 'held', 'tenant', 'engine', 'pool',
                        'cls', 'charged', 'charge_weight', 'seqs', 'stamp', 'picked_at',
                        'summary', 'inbox'}
-- `prompt_tokens` and `completion_tokens` are whole numbers as the caller wrote them
-- (strings), stored as they came. `ttft`: the run's time to first token in seconds, for its
-- class's controller (nil: none).
-- Also returns the fields read of the job (`engine`: the engine it ran on, false when the
-- job is gone; `inbox`, for tell_last_words), released or not, and the hash of the engine it
-- ran on as it is after the release where the release read it (nil else).
local function release_job(job_id, prompt_written, completion_written, attempt, ttft)
  local prompt_tokens, completion_tokens = prompt_written + 0, completion_written + 0
  -- Only what releasing needs: the job's payload can be large.
  local values = redis.call('HMGET', k_job(job_id), unpack(RELEASE_FIELDS))
  local job = {}
  for i, name in ipairs(RELEASE_FIELDS) do job[name] = values[i] end
  if job.state ~= 'running' then return 0, job end
  if attempt ~= '' and attempt ~= job.attempt then return 0, job end
  give_back(job_id, job)
  local seated = k_seated(job.pool, job.cls)
  if num(job.stamp) > num(redis.call('GET', seated)) then redis.call('SET', seated, job.stamp) end
  local engine
  if ttft or completion_tokens > 0 then engine = hgetall(k_engine(job.engine)) end
  if ttft then observe_ttft(job.engine, engine, job.cls, ttft, job.picked_at) end
  if completion_tokens > 0 then
    local quantile = numor(engine.out_quantile, 0.95)
    observe_output(job.pool, job.tenant, math.ceil(completion_tokens / seats(job)), quantile)
  end
  local charged = move_counter(job, token_charge(job, prompt_tokens, completion_tokens))
  local fields = {'reserved', '0', 'held', '0', 'lease_deadline', '', 'charged', charged,
    'used_prompt_tokens', prompt_written, 'used_completion_tokens', completion_written,
    'state', 'done', 'reason', 'released', 'finished_at', now_s()}
  if job.summary then  -- as drop_payload, in the same write
    table.insert(fields, 'payload')
    table.insert(fields, job.summary)
    redis.call('HDEL', k_job(job_id), 'summary')
  end
  redis.call('HSET', k_job(job_id), unpack(fields))
  redis.call('EXPIRE', k_job(job_id), KEEP)
  return 1, job, engine
end

-- The head of a tenant's queue, expiring heads whose queue deadline has passed (so a
-- timeout holds even between sweeps of expire_waiting).
local function live_head(queue)
  while true do
    local job_id = redis.call('LINDEX', queue, '0')
    if not job_id then return nil end
    local job = read_job(job_id)
    if not job.state then
      redis.call('LPOP', queue)  -- an id whose job hash is gone: nothing to run
    elseif num(job.deadline) <= NOW then
      expire_queued(job_id, job)
    else
      return job_id, job
    end
  end
end

-- Backlogged tenants of a class, least counter first, each with its counter (its score in
-- the backlog), read in pages: the first tenant usually has an admissible job, so most picks
-- read one page, however many tenants wait.
-- A page holds the fairest tenant, the AFFINITY_SCAN after it and the one that ends the
-- scan (pick_on): every score read is formatted by Redis and copied into Lua, so a page is
-- no longer than a pick needs.
local PAGE = 10
local PAGE_LAST = '9'  -- PAGE - 1, as a command's argument
local function backlogged(pool, cls)
  local key = k_backlog(pool, cls)
  local start, left = 0, LEFT_BACKLOG[key] or 0
  local page, index = redis.call('ZRANGE', key, '0', PAGE_LAST, 'WITHSCORES'), 0
  return function()
    index = index + 2  -- a page is flat: tenant, counter, tenant, counter, ...
    if index > #page then
      if #page < 2 * PAGE then return nil end
      -- Expiry during the scan removes only tenants already visited (nothing joins during a
      -- pick, and leave_backlog counts who leaves), so the unvisited ones moved up by as
      -- many places as left the backlog.
      local now_left = LEFT_BACKLOG[key] or 0
      start, left = start + PAGE - (now_left - left), now_left
      page, index = redis.call('ZRANGE', key, int(start), int(start + PAGE - 1), 'WITHSCORES'), 2
      if #page == 0 then return nil end
    end
    return page[index - 1], page[index] + 0
  end, function(n)  -- up to n tenants after the latest one given, of the page read
    local ahead = {}
    for i = index + 1, math.min(#page, index + 2 * n), 2 do table.insert(ahead, page[i]) end
    return ahead
  end
end

-- The offline gate of an engine: '' while offline work may be picked for it, else what
-- holds it shut (model.py `offline_gate` states the same rule):
-- - 'online_seats': online work (interactive, standard) holds at least
--   offline_load_threshold of the engine's seats, read live at the pick, so the gate
--   follows online load at once;
-- - 'load': the samplers' load (KV usage, reserved fraction, GPU tensor activity) is at or
--   over the threshold, or was and has not yet fallen below threshold - margin
--   (hysteresis: `load_closed` is set where the load is written, set_load.lua);
-- - 'seats': offline work may take only the seats online work leaves free, less
--   `offline_reserve` seats kept for online work arriving, so it fills idle seats and
--   gives them back as its sequences end.
local function offline_gate(engine, usage)
  local seats_total, inflight = num(engine.max_num_seqs), num(usage.inflight)
  local threshold = num(engine.offline_load_threshold)
  if inflight - num(usage.offline) >= threshold * seats_total then return 'online_seats' end
  local load = num(engine.load)
  if load >= threshold then return 'load' end
  if engine.load_closed == '1' and load >= threshold - num(engine.offline_gate_margin) then
    return 'load'
  end
  if inflight >= seats_total - num(engine.offline_reserve) then return 'seats' end
  return ''
end

-- Prefix-cache affinity (docs/DISPATCH.md, Prefix-cache affinity). A job's `affinity` key
-- names whose prefixes it shares (its tenant's, or its cache group's: the engines' prefix
-- cache is salted by the same scope), and `{p:<pool>}:affinity` maps each key to the engine
-- that ran its latest job: the one whose cache most likely holds the prefix. The fair order
-- chooses which job runs (pick_on, as without affinity); affinity chooses only where: a job
-- chosen for one engine runs on the engine that holds its prefix while that one can run it
-- at once, as the pick admitted it there:
-- - a free seat, not a place in its own queue (the job would wait there while the seat it
--   was chosen for stays free);
-- - it runs at most AFFINITY_SLACK sequences more than the engine the job was chosen for
--   (a tenant's prefix is not worth a busier engine: its tenants would wait longer for each
--   token than the others, and the engines' loads would drift apart);
-- - its class open there (class_limit, and the offline gate for offline work);
-- - its cost there within that engine's free KV, and its tenant's quota (or quota + burst,
--   as the pick allowed) still holding it.
-- Else it runs where it was chosen, which becomes its key's engine. Returns the holder's id,
-- the job's cost there, what it holds of its tenant's quota and its expected output; false
-- where another engine of the pool holds the key but cannot run the job now (a pick may then
-- prefer a job whose prefix the chosen engine holds: pick_on, candidate); nil where no other
-- engine of the pool holds it. Sets job.affinity_engine to the key's engine read.
local AFFINITY_SLACK = 2
local function affinity_engine(chosen_id, chosen_inflight, pool, job, limit)
  local holder = redis.call('HGET', k_affinity(pool), job.affinity)
  job.affinity_engine = holder
  if not holder or holder == chosen_id then return nil end
  -- Its seat first, from two fields: at full load every seat is taken, and a pick then
  -- reads no more of the holder than this.
  local seats_there = redis.call('HMGET', k_engine(holder), 'pool', 'max_num_seqs')
  if seats_there[1] ~= pool then return nil end  -- gone, or moved to another pool
  local usage = hgetall(k_engine_use(holder))
  if num(usage.inflight) >= num(seats_there[2]) then return false end
  if num(usage.inflight) > chosen_inflight + AFFINITY_SLACK then return false end
  local engine = hgetall(k_engine(holder))
  if class_limit(engine, usage, job.cls) ~= '' then return false end
  if job.cls == 'offline' and offline_gate(engine, usage) ~= '' then return false end
  local cost, quota_cost, out = job_cost(engine, job, limit.ceiling)
  if cost > engine_free(engine, usage) then return false end
  if limit.held + quota_cost > limit.bound then return false end
  return holder, cost, quota_cost, out
end

-- Prefix-cache locality at full load: a bounded deviation from the fair order (docs/
-- DISPATCH.md, Prefix-cache affinity; Cao et al. 2025, Deficit Longest Prefix Match). When
-- every engine is busy, a seat freed on engine E is the only place a job can start; the
-- fairest job F usually has its prefix on another, full engine, and would miss E's cache. In
-- the within-quota pass, where F's key is held by another engine of the pool that cannot run
-- F now, the pick for E looks past F at most AFFINITY_SCAN more backlogged tenants of F's
-- class, in counter order and only while their counter is at most F's tenant's counter plus
-- F's charge, for a head job whose key E holds and that admission lets run on E within
-- quota: the first one runs in F's place. A tenant so served is at most one request of F
-- ahead of its fair place (its counter is within F's charge of F's tenant's), and F keeps
-- its place at the head of the fair order for the next seat. model.py (FairModel._nearer)
-- states the same rule.
local AFFINITY_SCAN = 8

-- The keys of `tenants`' queues of `cls` (queue_job), in two reads whatever their number: a
-- tenant's key, and the engine that holds it (into `holders`).
local function queue_keys(pool, cls, tenants, holders)
  local hints = {}
  if #tenants == 0 then return hints end
  local keys = redis.call('HMGET', k_queue_keys(pool, cls), unpack(tenants))
  local unknown, seen = {}, {}
  for i, tenant in ipairs(tenants) do
    local key = keys[i]
    if key then
      hints[tenant] = key
      if key ~= '*' and key ~= '' and holders[key] == nil and not seen[key] then
        seen[key] = true
        table.insert(unknown, key)
      end
    end
  end
  if #unknown > 0 then
    local at = redis.call('HMGET', k_affinity(pool), unpack(unknown))
    for i, key in ipairs(unknown) do holders[key] = at[i] end
  end
  return hints
end

-- Pick the fairest admissible job of `pool` for one engine, reserve it and lease it.
-- Classes are tried in order of class virtual time (stride scheduling); inside a class,
-- backlogged tenants in order of VTC counter; the first head job that admission lets run
-- wins, but for the bounded deviation for locality in pass 1 (AFFINITY_SCAN). Pass 1 admits
-- within quota only; pass 2 (only when pass 1 found nothing and some head job would fit
-- within quota + burst) lets a tenant borrow its burst: the engine then has idle capacity,
-- meaning room for the job and no waiting job of the pool that it could run within its
-- tenant's quota.
-- The quota a tenant's jobs hold here is bounded by its lease in the pool too (k_lease; the
-- tenant's quota is leased to the pools it uses: leases.py, docs/proposals/0001): a job is
-- admitted while what the tenant's jobs hold here with it stays within the lease as well as
-- within quota (quota + burst in pass 2). Where the lease alone holds the fairest head job
-- back, a pick that may `ask` stops there and returns what the tenant's lease should grow
-- by (`wanted`): its caller asks the tenant's slot for it and picks again
-- (FairQueue.pick_after_asking), so the fair order holds across the grant. Where a request
-- was not answered (the lease did not change since), the pool asks again for that tenant
-- LEASE_ASK_S after it; in between, and in a pick that may not ask, such a head job is
-- passed over like one over quota, and the next tenant's may ask in turn.
-- The job may run on another engine of the pool than the one it was picked for, the one
-- that holds its prefix (affinity_engine): its hash's `engine` says where.
-- Returns the job id and its hash as a table (as HGETALL would give it), nil when nothing
-- may run there now, nil and an error reply, or nil, nil and what a lease should grow by.
-- `engine` and `usage` are the engine's hashes when the caller has read them already.
local LEASE_ASK_S = 1
local function pick_on(engine_id, pool, lease_s, weights, ask, engine, usage)
  engine = engine or hgetall(k_engine(engine_id))
  -- An engine's hash is in its pool's slot: one of another pool, or none, is not found here.
  if not engine.pool then
    return nil, redis.error_reply('engine ' .. engine_id .. ' does not serve pool ' .. pool)
  end
  if engine.pool ~= pool then
    return nil, redis.error_reply('engine ' .. engine_id .. ' serves pool ' .. engine.pool ..
      ', not ' .. pool)
  end
  usage = usage or hgetall(k_engine_use(engine_id))
  -- Its seats, and the sequences it may hold waiting in its own queue (EnginePolicy). A job
  -- of several sequences is picked while one seat is free and takes as many as it runs: one
  -- that waited for all of them could wait for ever behind jobs of one.
  if num(usage.inflight) >= num(engine.max_num_seqs) + num(engine.queued) then return nil end
  local free_bytes = engine_free(engine, usage)
  local offline_open = offline_gate(engine, usage) == ''

  local clock = hgetall(k_clock(pool))
  local order = {}
  for i, cls in ipairs(CLASSES) do
    if (cls ~= 'offline' or offline_open) and class_limit(engine, usage, cls) == '' then
      table.insert(order, {cls = cls, vt = num(clock[cls]), rank = i})
    end
  end
  table.sort(order, function(a, b)
    if a.vt ~= b.vt then return a.vt < b.vt end
    return a.rank < b.rank
  end)

  -- Whether admission lets `job`, the head of `tenant`'s queue, run here: its cost within
  -- the engine's free KV, and its tenant's quota (or quota + burst, with `allow_burst`) and
  -- lease in the pool holding it. Returns its tenant's weight, its expected output and what
  -- admitted it (for affinity_engine), and sets its reservation; else nil and whether it
  -- would fit with burst. Where the lease alone holds it back and the pick may ask, sets
  -- `wanted`.
  local wanted
  local function admit(tenant, job, allow_burst)
    local policy = redis.call('HMGET', k_tenant(tenant), 'quota_bytes', 'burst_bytes', 'weight')
    local quota = num(policy[1])
    local ceiling = quota + num(policy[2])
    local cost, quota_cost, out = job_cost(engine, job, ceiling)
    if cost > free_bytes then return nil, false end
    local lease = redis.call('HMGET', k_lease(tenant), 'leased', 'held', 'asked_at')
    local leased, before = num(lease[1]), num(lease[2])
    local held = before + quota_cost
    local within = held <= quota or (allow_burst and held <= ceiling)
    if within and held <= leased then
      job.reserved, job.held = int(cost), int(quota_cost)
      local limit = {held = before, ceiling = ceiling, bound = math.min(leased, quota)}
      if held > quota then limit.bound = math.min(leased, ceiling) end
      return num(policy[3]), out, limit
    end
    -- A pool asks again once its lease changed since it last asked (a grant applied or a
    -- shrink clears `asked_at`) or LEASE_ASK_S after: one that got nothing waits for
    -- housekeeping to bring leases back from the tenant's other pools
    -- (FairQueue.rebalance_leases).
    local again = not lease[3] or NOW - num(lease[3]) >= LEASE_ASK_S
    if within and ask and again then
      -- The lease alone holds it back: ask for the tenant's whole quota (quota + burst when
      -- only the burst admits it, which the pool's idle capacity allows), at least `need`.
      local goal, idle = quota, 0
      if held > quota then goal, idle = ceiling, 1 end
      wanted = {tenant = tenant, idle = idle, want = goal - leased, need = held - leased}
      redis.call('HSET', k_lease(tenant), 'asked_at', now_s())
    end
    return nil, held <= ceiling
  end

  -- The head of `tenant`'s queue in `cls` where this engine holds its affinity key and
  -- admission lets it run here within quota (the deviation for locality); nil else. Its key
  -- and state are read first, the whole job only where this engine holds the key; an expired
  -- head is passed over (the queue's own scans expire it). `holders` caches the affinity map;
  -- `hints`, the keys of the tenants' queues (queue_job) where they were read.
  local function held_here(cls, tenant, holders, hints)
    local hint = hints[tenant]
    if hint and hint ~= '*' then
      if hint == '' then return nil end
      if holders[hint] == nil then holders[hint] = redis.call('HGET', k_affinity(pool), hint) end
      if holders[hint] ~= engine_id then return nil end
    end
    local job_id = redis.call('LINDEX', k_queue(pool, cls, tenant), '0')
    if not job_id then return nil end
    local head = redis.call('HMGET', k_job(job_id), 'affinity', 'state', 'deadline')
    local key = head[1]
    if not key or key == '' or head[2] ~= 'queued' or num(head[3]) <= NOW then return nil end
    local holder = holders[key]
    if holder == nil then
      holder = redis.call('HGET', k_affinity(pool), key) or false
      holders[key] = holder
    end
    if holder ~= engine_id then return nil end
    local job = read_job(job_id)
    local weight, out, limit = admit(tenant, job, false)
    if not weight then return nil end
    job.affinity_engine = engine_id
    return job_id, job, weight, out, limit
  end

  -- First admissible head job of the class, with its tenant's weight; also says whether
  -- one would fit with burst. In the within-quota pass the job's engine is settled here
  -- (`placed`: affinity_engine's answer, for pick_on), and a job whose prefix another, busy
  -- engine holds may give way to one whose prefix this engine holds (AFFINITY_SCAN).
  local function candidate(cls, allow_burst)
    local would_burst = false
    local fairest, bound, scanned, holders, hints
    local next_tenant, ahead = backlogged(pool, cls)
    for tenant, counter in next_tenant do
      if fairest then
        if scanned >= AFFINITY_SCAN or counter > bound then break end
        scanned = scanned + 1
        local job_id, job, weight, out, limit = held_here(cls, tenant, holders, hints)
        if wanted then return nil end
        if job_id then return job_id, job, weight, false, out, limit, {} end
      else
        local job_id, job = live_head(k_queue(pool, cls, tenant))
        if job_id then
          local weight, out, limit = admit(tenant, job, allow_burst)
          if wanted then return nil end
          if not weight then
            would_burst = would_burst or out  -- admit's second answer: it would with burst
          else
            if allow_burst or not job.affinity or job.affinity == '' then
              return job_id, job, weight, false, out, limit
            end
            local placed = {affinity_engine(engine_id, num(usage.inflight), pool, job, limit)}
            if placed[1] ~= false then return job_id, job, weight, false, out, limit, placed end
            -- Its prefix is on another engine that cannot run it now: look on for a job
            -- whose prefix is here, from a tenant whose counter is within this job's
            -- charge (as the pick would charge it here: token_charge) of its tenant's.
            fairest = {job_id, job, weight, out, limit, placed}
            local charged_weight = weight
            if charged_weight <= 0 then charged_weight = 1 end
            bound = counter + (num(job.prompt_tokens) + 2 * out) / charged_weight
            scanned, holders = 0, {[job.affinity] = job.affinity_engine}
            hints = queue_keys(pool, cls, ahead(AFFINITY_SCAN), holders)
          end
        end
      end
    end
    if fairest then
      return fairest[1], fairest[2], fairest[3], false, fairest[4], fairest[5], fairest[6]
    end
    return nil, nil, nil, would_burst
  end

  local function choose()
    local burst_possible = false
    for _, entry in ipairs(order) do
      local job_id, job, weight, would_burst, out, limit, placed = candidate(entry.cls, false)
      if job_id or wanted then return job_id, job, weight, out, limit, placed end
      burst_possible = burst_possible or would_burst
    end
    if not burst_possible then return nil end
    for _, entry in ipairs(order) do
      local job_id, job, weight, _, out, limit = candidate(entry.cls, true)
      if job_id or wanted then return job_id, job, weight, out, limit end
    end
    return nil
  end

  local job_id, job, weight, out, limit, placed = choose()
  if wanted then return nil, nil, wanted end
  if not job_id then return nil end
  local cls, tenant = job.cls, job.tenant

  -- The fair order chose the job; its prefix decides where it runs (settled in `candidate`
  -- where the within-quota pass chose it).
  if job.affinity and job.affinity ~= '' then
    placed = placed or {affinity_engine(engine_id, num(usage.inflight), pool, job, limit)}
    local holder, cost, quota_cost, holder_out = placed[1], placed[2], placed[3], placed[4]
    if holder then
      engine_id, out = holder, holder_out
      job.reserved, job.held = int(cost), int(quota_cost)
    end
    if job.affinity_engine ~= engine_id then
      redis.call('HSET', k_affinity(pool), job.affinity, engine_id)
    end
    job.affinity_engine = nil
  end

  -- The job's stamp is its tenant's counter before its charge: its place in the fair queue's
  -- order, which the engine keeps among the jobs waiting there for a seat (engine_priority).
  if weight <= 0 then weight = 1 end
  local counter
  counter, job.stamp = get_counter(pool, cls, tenant)
  job.charge_weight = fmt(weight)
  job.charged = move_counter(job, token_charge(job, num(job.prompt_tokens), out), counter)
  unqueue(job_id, job)

  -- The chosen class advances by 1/weight. Classes behind it had nothing admissible (empty,
  -- blocked, or offline over the load gate); lifting them to its time keeps them from banking
  -- credit, which would turn into strict priority later.
  local vt = num(clock[cls])
  local times = {cls, fmt(vt + 1 / weights[cls])}
  for _, other in ipairs(CLASSES) do
    if other ~= cls and num(clock[other]) < vt then
      table.insert(times, other)
      table.insert(times, fmt(vt))
    end
  end
  redis.call('HSET', k_clock(pool), unpack(times))

  redis.call('HINCRBY', k_lease(tenant), 'held', job.held)
  local use, seats_taken = k_engine_use(engine_id), int(seats(job))
  redis.call('HINCRBY', use, 'reserved', job.reserved)
  redis.call('HINCRBY', use, 'inflight', seats_taken)
  if cls ~= 'interactive' then
    redis.call('HINCRBY', use, cls, seats_taken)
  end
  local attempt = num(job.attempt) + 1
  local lease_deadline = NOW + lease_s
  job.state, job.engine, job.attempt = 'running', engine_id, int(attempt)
  job.lease_deadline, job.picked_at = fmt(lease_deadline), now_s()
  redis.call('HSET', k_job(job_id), 'charge_weight', job.charge_weight, 'charged', job.charged,
    'stamp', job.stamp,
    'state', job.state, 'engine', engine_id, 'attempt', job.attempt,
    'lease_deadline', job.lease_deadline, 'reserved', job.reserved, 'held', job.held,
    'picked_at', job.picked_at)
  redis.call('ZADD', k_inflight(), job.lease_deadline, job_id)
  return job_id, job
end

-- The engines of a pool that have a free seat or place, most free KV first (ties: fewest in
-- flight, then by name): a job goes where it has the most room. Only the fields that room
-- needs are read here; pick_on reads the whole hashes of the engines it tries (most picks
-- try one).
local ROOM_FIELDS = {'kv_budget_bytes', 'reservation', 'kv_scale', 'kv_used_at',
                     'kv_excess_bytes', 'max_num_seqs', 'queued'}
local function engines_by_room(pool)
  local room = {}
  for _, engine_id in ipairs(redis.call('SMEMBERS', k_pool_engines(pool))) do
    local values = redis.call('HMGET', k_engine(engine_id), unpack(ROOM_FIELDS))
    local engine = {}
    for i, name in ipairs(ROOM_FIELDS) do engine[name] = values[i] or nil end
    local used = redis.call('HMGET', k_engine_use(engine_id), 'reserved', 'inflight')
    local usage = {reserved = used[1], inflight = used[2]}
    local inflight = num(usage.inflight)
    if inflight < num(engine.max_num_seqs) + num(engine.queued) then
      table.insert(room, {id = engine_id, free = engine_free(engine, usage), inflight = inflight})
    end
  end
  table.sort(room, function(a, b)
    if a.free ~= b.free then return a.free > b.free end
    if a.inflight ~= b.inflight then return a.inflight < b.inflight end
    return a.id < b.id
  end)
  return room
end

-- What an enqueue checks a job against, for the whole pool at once: how many engines serve
-- it, the largest KV budget among them and whether one reserves predictions. Written again
-- whenever an engine's policy changes or it leaves (pool_shape.lua), so an enqueue reads one
-- hash however many engines the pool has; recomputed here where it is missing.
local function pool_shape(pool)
  local shape = redis.call('HMGET', k_pool_shape(pool), 'engines', 'largest', 'predicts')
  if shape[1] then
    return {engines = num(shape[1]), largest = num(shape[2]), predicts = shape[3] == '1'}
  end
  local engines = redis.call('SMEMBERS', k_pool_engines(pool))
  local largest, predicts = 0, false
  for _, engine_id in ipairs(engines) do
    local fields = redis.call('HMGET', k_engine(engine_id), 'kv_budget_bytes', 'reservation')
    local budget = num(fields[1])
    if budget > largest then largest = budget end
    if fields[2] == 'predict' then predicts = true end
  end
  redis.call('HSET', k_pool_shape(pool), 'engines', #engines, 'largest', int(largest),
    'predicts', predicts and '1' or '0')
  return {engines = #engines, largest = largest, predicts = predicts}
end

-- Dispatch loops (workers/dispatch.py): a loop that finds nothing to run waits a while for
-- a wake-up instead of ending, so new work reaches a worker without a Celery message.
-- `{p:<pool>}:loops:idle` holds the waiting loops, scored by when they stop waiting (a loop
-- that died waiting is forgotten then); waking one pushes to its own wake-up list,
-- `{p:<pool>}:loop:<token>:wake`.

-- Wakes the loop that went idle last (the others time out and end: as many loops keep
-- waiting as the traffic needs). Returns whether there was one.
local function wake_idle_loop(pool)
  local idle = k_idle_loops(pool)
  local popped = redis.call('ZPOPMAX', idle)
  if #popped == 0 then return false end
  if popped[2] + 0 <= NOW then  -- the latest stopped waiting, and so did the others
    redis.call('DEL', idle)
    return false
  end
  local wake = k_loop_wake(popped[1])
  redis.call('RPUSH', wake, '1')
  redis.call('EXPIRE', wake, 60)
  return true
end

-- New work in the pool: wake an idle loop, else ask the caller to summon one (a Celery
-- message), unless one summoned less than `summon_s` ago has not started yet: it fans out
-- when it starts (see pick_reply), so a burst costs one message, not one per job.
-- `summon_s` is a string, as the caller got it: a number would be formatted again.
-- Returns 'woke', 'summon' or 'summoned'.
local function summon_loop(pool, summon_s)
  if wake_idle_loop(pool) then return 'woke' end
  if redis.call('SET', k_loop_summoned(pool), '1', 'NX', 'EX', summon_s) then return 'summon' end
  return 'summoned'
end

local function pool_has_queued(pool)
  for _, cls in ipairs(CLASSES) do
    if redis.call('ZCARD', k_backlog(pool, cls)) > 0 then return true end
  end
  return false
end

-- Pick for the given engine, or ('') for the pool's engine with the most room that has an
-- admissible job. Returns the job as an array: its id, '1' where its worker should summon the
-- next loop (else ''), then its PICK_FIELDS in order (false where it has none): no JSON to
-- encode, and its payload is copied once more, not escaped or joined to another string;
-- false when nothing may run now; an error reply; or (`ask`: the pick may ask for a lease,
-- see pick_on) {"want": {tenant, idle, want, need, engine}} as JSON, when a tenant's lease
-- in the pool holds its fairest job back.
-- `loop` (optional) is the dispatch loop picking: {token, idle_s, starting, summon_s}. A loop
-- that finds nothing is registered idle for `idle_s`. A loop just started clears the summons
-- that started it; if more work waits and no loop is idle, the answer asks its worker to
-- summon the next loop (fan-out). `engine`: the engine's hash, when the caller has read it.
local function pick_reply(pool, engine_id, lease_s, weights, loop, ask, engine)
  loop = loop or {}
  if loop.starting then redis.call('DEL', k_loop_summoned(pool)) end
  local job_id, job, wanted
  if engine_id ~= '' then
    job_id, job, wanted = pick_on(engine_id, pool, lease_s, weights, ask, engine)
    if not job_id and job then return job end  -- pick_on's error reply
  else
    for _, room in ipairs(engines_by_room(pool)) do
      job_id, job, wanted = pick_on(room.id, pool, lease_s, weights, ask)
      if job_id or wanted then break end
    end
  end
  if wanted then
    -- Not idle: the caller asks for the lease and picks again, for the same engine.
    wanted.engine = engine_id
    return cjson.encode({want = wanted})
  end
  if not job_id then
    if loop.token and loop.token ~= '' then
      redis.call('ZADD', k_idle_loops(pool), fmt(NOW + loop.idle_s), loop.token)
    end
    return false
  end
  local summon = ''
  if loop.starting and pool_has_queued(pool) and summon_loop(pool, loop.summon_s) == 'summon' then
    summon = '1'
  end
  local reply = {job_id, summon}
  for i, name in ipairs(PICK_FIELDS) do reply[i + 2] = job[name] or false end
  return reply
end

-- A dispatch loop's arguments to a pick, from ARGV[first..]: token ('' = not a loop),
-- idle_s, starting ('1' / ''), summon_s.
local function loop_from(first)
  return {token = ARGV[first], idle_s = numor(ARGV[first + 1], nil),
          starting = ARGV[first + 2] == '1', summon_s = ARGV[first + 3]}
end

local function weights_from(first)
  return {interactive = ARGV[first] + 0, standard = ARGV[first + 1] + 0,
          offline = ARGV[first + 2] + 0}
end
