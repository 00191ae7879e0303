-- Shared helpers, prepended to every script by queue.py (one script = one atomic step).
-- ARGV[1] is the key prefix, ARGV[2] the current time (seconds; empty: Redis's own clock),
-- ARGV[3] the time to keep a finished job and its event list (seconds). Script arguments
-- start at ARGV[4]. Key names mirror keys.py one for one.
local P = ARGV[1]
local KEEP_S = tonumber(ARGV[3])
-- Redis's clock by default: web and worker hosts then share one time, so leases and queue
-- deadlines do not depend on their clocks agreeing. Tests pass their own.
local NOW
if ARGV[2] == '' then
  local clock = redis.call('TIME')
  NOW = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
else
  NOW = tonumber(ARGV[2])
end
local CLASSES = {'interactive', 'standard', 'offline'}

local function k_job(id) return P .. 'job:' .. id end
local function k_events(id) return P .. 'job:' .. id .. ':events' end
local function k_queue(pool, cls, tenant) return P .. 'q:' .. pool .. ':' .. cls .. ':' .. tenant end
local function k_backlog(pool, cls) return P .. 'backlog:' .. pool .. ':' .. cls end
local function k_counters(pool, cls) return P .. 'vtc:' .. pool .. ':' .. cls end
local function k_floor(pool, cls) return P .. 'vtcfloor:' .. pool .. ':' .. cls end
local function k_clock(pool) return P .. 'cvt:' .. pool end
local function k_tenant(t) return P .. 'tenant:' .. t end
local function k_tenant_use(t) return P .. 'tenant:' .. t .. ':use' end
local function k_tenants() return P .. 'tenants' end
local function k_engine(e) return P .. 'engine:' .. e end
local function k_engine_use(e) return P .. 'engine:' .. e .. ':use' end
local function k_engines() return P .. 'engines' end
local function k_pool_engines(pool) return P .. 'pool:' .. pool .. ':engines' end
local function k_pools() return P .. 'pools' end
local function k_inflight() return P .. 'inflight' end
local function k_waiting() return P .. 'waiting' end

-- A missing hash field comes back as false.
local function num(v)
  if not v then return 0 end
  return tonumber(v) or 0
end

-- Lua turns numbers into strings with 14 digits; counters and byte totals need all of them.
local function fmt(x) return string.format('%.17g', x) end
local function int(x) return string.format('%d', x) end

local function hgetall(key)
  local flat = redis.call('HGETALL', key)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end

local function emit(job_id, event)
  event.at = NOW
  redis.call('RPUSH', k_events(job_id), cjson.encode(event))
  redis.call('EXPIRE', k_events(job_id), KEEP_S)
end

local function get_counter(pool, cls, tenant)
  return num(redis.call('HGET', k_counters(pool, cls), tenant))
end

-- XX: a tenant's score in the backlog follows its counter only while it is backlogged.
local function set_counter(pool, cls, tenant, value)
  redis.call('HSET', k_counters(pool, cls), tenant, fmt(value))
  redis.call('ZADD', k_backlog(pool, cls), 'XX', fmt(value), tenant)
end

-- A tenant whose queue just became non-empty joins the backlog with its counter lifted to
-- the least backlogged counter (or to the floor when nobody is backlogged), so time spent
-- idle is not banked as credit to be spent later in a burst.
local function join_backlog(pool, cls, tenant)
  local backlog = k_backlog(pool, cls)
  local least = redis.call('ZRANGE', backlog, 0, 0, 'WITHSCORES')
  local target
  if #least > 0 then
    target = tonumber(least[2])
  else
    target = num(redis.call('GET', k_floor(pool, cls)))
  end
  local counter = get_counter(pool, cls, tenant)
  if counter < target then counter = target end
  redis.call('HSET', k_counters(pool, cls), tenant, fmt(counter))
  redis.call('ZADD', backlog, fmt(counter), tenant)
end

local function leave_backlog(pool, cls, tenant)
  local backlog = k_backlog(pool, cls)
  redis.call('ZREM', backlog, tenant)
  if redis.call('ZCARD', backlog) == 0 then
    redis.call('SET', k_floor(pool, cls), fmt(get_counter(pool, cls, tenant)))
  end
end

local function queue_job(job_id, pool, cls, tenant, at_head)
  local queue = k_queue(pool, cls, tenant)
  local length
  if at_head then
    length = redis.call('LPUSH', queue, job_id)
  else
    length = redis.call('RPUSH', queue, job_id)
  end
  if length == 1 then join_backlog(pool, cls, tenant) end
end

local function unqueue(job_id, job)
  local queue = k_queue(job.pool, job.cls, job.tenant)
  redis.call('LREM', queue, 1, job_id)
  redis.call('ZREM', k_waiting(), job_id)
  if redis.call('LLEN', queue) == 0 then leave_backlog(job.pool, job.cls, job.tenant) end
end

-- Moves the tenant's counter by the difference between a new charge and what the job was
-- charged so far (the estimate at pick), and records the new charge on the job.
local function recharge(job_id, job, new_charge)
  local delta = new_charge - num(job.charged)
  if delta ~= 0 then
    set_counter(job.pool, job.cls, job.tenant, get_counter(job.pool, job.cls, job.tenant) + delta)
  end
  redis.call('HSET', k_job(job_id), 'charged', fmt(new_charge))
end

-- Real tokens as VTC charges them: output costs twice what input does.
local function token_charge(job, prompt_tokens, completion_tokens)
  local weight = num(job.charge_weight)
  if weight <= 0 then weight = 1 end
  return (prompt_tokens + 2 * completion_tokens) / weight
end

-- Gives back everything a running job holds: its bytes on the tenant and the engine, its
-- seat on the engine, its lease.
local function free_running(job_id, job)
  local reserved = num(job.reserved)
  redis.call('HINCRBY', k_tenant_use(job.tenant), 'reserved', int(-reserved))
  redis.call('HINCRBY', k_engine_use(job.engine), 'reserved', int(-reserved))
  redis.call('HINCRBY', k_engine_use(job.engine), 'inflight', -1)
  redis.call('ZREM', k_inflight(), job_id)
  redis.call('HSET', k_job(job_id), 'reserved', '0', 'lease_deadline', '')
end

local function finish(job_id, state, reason)
  redis.call('HSET', k_job(job_id), 'state', state, 'reason', reason, 'finished_at', fmt(NOW))
  redis.call('EXPIRE', k_job(job_id), KEEP_S)
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
  queue_job(job_id, job.pool, job.cls, job.tenant, true)
  emit(job_id, {event = 'requeued', reason = reason})
end

local function timeouts_from(first)
  return {interactive = tonumber(ARGV[first]), standard = tonumber(ARGV[first + 1]),
          offline = tonumber(ARGV[first + 2])}
end
