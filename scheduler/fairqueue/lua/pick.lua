-- Pick the fairest admissible job of a pool for one engine, reserve it and lease it.
-- ARGV[4..]: engine_id, pool, lease_s, then class weights (interactive, standard, offline)
-- Returns the job hash as a flat list, or false when nothing may run now.
--
-- Classes are tried in order of class virtual time (stride scheduling); inside a class,
-- backlogged tenants in order of VTC counter; the first head job that admission lets run
-- wins. Pass 1 admits within quota only; pass 2 (only when pass 1 found nothing and some
-- head job would fit within quota + burst) lets a tenant borrow its burst: the engine then
-- has idle capacity, meaning room for the job and no waiting job of the pool that it could
-- run within its tenant's quota.
local engine_id, pool, lease_s = ARGV[4], ARGV[5], tonumber(ARGV[6])
local weights = {interactive = tonumber(ARGV[7]), standard = tonumber(ARGV[8]),
                 offline = tonumber(ARGV[9])}

local engine = hgetall(k_engine(engine_id))
if not engine.pool then return redis.error_reply('unknown engine ' .. engine_id) end
if engine.pool ~= pool then
  return redis.error_reply('engine ' .. engine_id .. ' serves pool ' .. engine.pool .. ', not ' .. pool)
end
local usage = hgetall(k_engine_use(engine_id))
if num(usage.inflight) >= num(engine.max_num_seqs) then return false end
local free_bytes = num(engine.kv_budget_bytes) - num(usage.reserved)
local offline_open = num(engine.load) < num(engine.offline_load_threshold)

local clock = hgetall(k_clock(pool))
local order = {}
for i, cls in ipairs(CLASSES) do
  if cls ~= 'offline' or offline_open then
    table.insert(order, {cls = cls, vt = num(clock[cls]), rank = i})
  end
end
table.sort(order, function(a, b)
  if a.vt ~= b.vt then return a.vt < b.vt end
  return a.rank < b.rank
end)

-- The head of a tenant's queue, expiring heads whose queue deadline has passed (so a
-- timeout holds even between sweeps of expire_waiting).
local function live_head(queue)
  while true do
    local job_id = redis.call('LINDEX', queue, 0)
    if not job_id then return nil end
    local job = hgetall(k_job(job_id))
    if not job.state then
      redis.call('LPOP', queue)  -- an id whose job hash is gone: nothing to run
    elseif num(job.deadline) <= NOW then
      expire_queued(job_id, job)
    else
      return job_id, job
    end
  end
end

-- Backlogged tenants of a class, least counter first, read in pages: the first tenant
-- usually has an admissible job, so most picks read one page, however many tenants wait.
local PAGE = 16
local function backlogged(cls)
  local key = k_backlog(pool, cls)
  local start, size = 0, redis.call('ZCARD', key)
  local page, index = redis.call('ZRANGE', key, 0, PAGE - 1), 0
  return function()
    index = index + 1
    if index > #page then
      if #page < PAGE then return nil end
      -- Expiry during the scan removes only tenants already visited (nothing joins during a
      -- pick), so the unvisited ones moved up by as many places as the backlog shrank.
      local new_size = redis.call('ZCARD', key)
      start, size = start + PAGE - (size - new_size), new_size
      page, index = redis.call('ZRANGE', key, start, start + PAGE - 1), 1
      if #page == 0 then return nil end
    end
    return page[index]
  end
end

-- First admissible head job of the class; also says whether one would fit with burst.
local function candidate(cls, allow_burst)
  local would_burst = false
  for tenant in backlogged(cls) do
    local job_id, job = live_head(k_queue(pool, cls, tenant))
    if job_id then
      local cost = num(job.kv_bytes)
      if cost <= free_bytes then
        local policy = redis.call('HMGET', k_tenant(tenant), 'quota_bytes', 'burst_bytes')
        local held = num(redis.call('HGET', k_tenant_use(tenant), 'reserved')) + cost
        local quota = num(policy[1])
        local ceiling = quota + num(policy[2])
        if held <= quota then return job_id, job, false end
        if held <= ceiling then
          if allow_burst then return job_id, job, false end
          would_burst = true
        end
      end
    end
  end
  return nil, nil, would_burst
end

local function choose()
  local burst_possible = false
  for _, entry in ipairs(order) do
    local job_id, job, would_burst = candidate(entry.cls, false)
    if job_id then return job_id, job end
    burst_possible = burst_possible or would_burst
  end
  if not burst_possible then return nil end
  for _, entry in ipairs(order) do
    local job_id, job = candidate(entry.cls, true)
    if job_id then return job_id, job end
  end
  return nil
end

local job_id, job = choose()
if not job_id then return false end
local cls, tenant = job.cls, job.tenant

-- Charge the estimate first, so the counter a leaving tenant leaves as the floor includes it.
local weight = num(redis.call('HGET', k_tenant(tenant), 'weight'))
if weight <= 0 then weight = 1 end
redis.call('HSET', k_job(job_id), 'charge_weight', fmt(weight))
job.charge_weight = weight
recharge(job_id, job, token_charge(job, num(job.prompt_tokens), num(job.max_tokens)))
unqueue(job_id, job)

-- The chosen class advances by 1/weight. Classes behind it had nothing admissible (empty,
-- blocked, or offline over the load gate); lifting them to its time keeps them from banking
-- credit, which would turn into strict priority later.
local vt = num(clock[cls])
for _, other in ipairs(CLASSES) do
  if other ~= cls and num(clock[other]) < vt then
    redis.call('HSET', k_clock(pool), other, fmt(vt))
  end
end
redis.call('HSET', k_clock(pool), cls, fmt(vt + 1 / weights[cls]))

local cost = num(job.kv_bytes)
redis.call('HINCRBY', k_tenant_use(tenant), 'reserved', int(cost))
redis.call('HINCRBY', k_engine_use(engine_id), 'reserved', int(cost))
redis.call('HINCRBY', k_engine_use(engine_id), 'inflight', 1)
local attempt = num(job.attempt) + 1
local lease_deadline = NOW + lease_s
redis.call('HSET', k_job(job_id), 'state', 'running', 'engine', engine_id, 'attempt', int(attempt),
  'lease_deadline', fmt(lease_deadline), 'reserved', int(cost), 'picked_at', fmt(NOW))
redis.call('ZADD', k_inflight(), fmt(lease_deadline), job_id)
emit(job_id, {event = 'picked', engine = engine_id, attempt = attempt})
local result = redis.call('HGETALL', k_job(job_id))
table.insert(result, 'job_id')
table.insert(result, job_id)
return result
