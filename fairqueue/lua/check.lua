-- Compare a pool's reserved totals with its in-flight jobs, atomically (nothing moves in the
-- pool while it counts). ARGV[4]: the pool, ARGV[5]: '1' to repair (set the engines' totals
-- and the tenants' leases' `held` to what the in-flight jobs hold, and the backlogs to the
-- queues), ARGV[6..]: the tenants whose leases are checked (with those of the jobs found).
-- Returns JSON: {tenants: {t: [bytes its lease here records held, bytes its in-flight jobs
-- here hold]}, engines: {e: [recorded bytes, expected bytes, recorded inflight, expected
-- inflight]}, problems: [text]}. In flight counts seats (sequences), as `seats` does; the
-- seats standard and offline jobs hold (the seat bounds count them) are checked (and
-- repaired) too.
local pool, repair = ARGV[4], ARGV[5] == '1'
local tenant_bytes, engine_bytes, engine_jobs = {}, {}, {}
local engine_class = {standard = {}, offline = {}}
local problems = {}
local function add(t, key, amount) t[key] = (t[key] or 0) + amount end
for _, job_id in ipairs(redis.call('ZRANGE', k_inflight(), 0, -1)) do
  local job = hgetall(k_job(job_id))
  if job.state == 'running' then
    add(tenant_bytes, job.tenant, held_bytes(job))
    add(engine_bytes, job.engine, num(job.reserved))
    add(engine_jobs, job.engine, seats(job))
    if engine_class[job.cls] then add(engine_class[job.cls], job.engine, seats(job)) end
  else
    table.insert(problems, 'in-flight index holds job ' .. job_id .. ' in state ' .. tostring(job.state))
    if repair then redis.call('ZREM', k_inflight(), job_id) end
  end
end
local engines = {}
for _, e in ipairs(redis.call('SMEMBERS', k_pool_engines(pool))) do engines[e] = true end
for e in pairs(engine_bytes) do engines[e] = true end
local engine_report = {}
for e in pairs(engines) do
  local recorded = num(redis.call('HGET', k_engine_use(e), 'reserved'))
  local recorded_jobs = num(redis.call('HGET', k_engine_use(e), 'inflight'))
  local expected, expected_jobs = engine_bytes[e] or 0, engine_jobs[e] or 0
  engine_report[e] = {recorded, expected, recorded_jobs, expected_jobs}
  if recorded ~= expected or recorded_jobs ~= expected_jobs then
    table.insert(problems, string.format('engine %s: reserved %d bytes / %d jobs, in-flight jobs hold %d / %d',
      e, recorded, recorded_jobs, expected, expected_jobs))
    if repair then
      redis.call('HSET', k_engine_use(e), 'reserved', int(expected), 'inflight', int(expected_jobs))
    end
  end
  for cls, held in pairs(engine_class) do
    local recorded_class = num(redis.call('HGET', k_engine_use(e), cls))
    local expected_class = held[e] or 0
    if recorded_class ~= expected_class then
      table.insert(problems, string.format('engine %s: %d %s seats, in-flight %s jobs hold %d',
        e, recorded_class, cls, cls, expected_class))
      if repair then redis.call('HSET', k_engine_use(e), cls, int(expected_class)) end
    end
  end
end
-- A tenant is in a backlog exactly when its queue there is non-empty.
for _, cls in ipairs(CLASSES) do
  for _, t in ipairs(redis.call('HKEYS', k_counters(pool, cls))) do
    local waiting = redis.call('LLEN', k_queue(pool, cls, t)) > 0
    local backlogged = redis.call('ZSCORE', k_backlog(pool, cls), t) ~= false
    if waiting ~= backlogged then
      table.insert(problems, string.format('pool %s class %s tenant %s: queue %s but backlog says %s',
        pool, cls, t, waiting and 'non-empty' or 'empty', backlogged and 'backlogged' or 'idle'))
      if repair then
        if waiting then join_backlog(pool, cls, t) else redis.call('ZREM', k_backlog(pool, cls), t) end
      end
    end
  end
end
local tenants = {}
for i = 6, #ARGV do tenants[ARGV[i]] = true end
for t in pairs(tenant_bytes) do tenants[t] = true end
local tenant_report = {}
for t in pairs(tenants) do
  local recorded, expected = num(redis.call('HGET', k_lease(t), 'held')), tenant_bytes[t] or 0
  tenant_report[t] = {recorded, expected}
  if recorded ~= expected then
    table.insert(problems, string.format(
      'tenant %s: its lease in pool %s records %d bytes held, in-flight jobs hold %d',
      t, pool, recorded, expected))
    if repair then redis.call('HSET', k_lease(t), 'held', int(expected)) end
  end
end
local report = {tenants = tenant_report, engines = engine_report, problems = problems}
-- cjson turns an empty table into {}; the Python side reads an empty problems object as none.
return cjson.encode(report)
