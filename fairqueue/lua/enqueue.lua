-- Enqueue one job at the tail of its tenant's queue, or reject what can never run.
-- ARGV[4..]: job_id, tenant, pool, class, prompt_tokens, max_tokens, kv_bytes, queue timeout
-- (seconds), payload, summon_s ('' = leave dispatch loops alone; else see summon_loop),
-- inbox ('' = none: the job's events go to its own list; see emit_raw), max_waiting (the most
-- jobs of the tenant that may wait in the pool's queues, its classes together; 0 = no limit),
-- summary (what the job keeps in place of its payload once it is over; '' = the payload),
-- seqs (the sequences it runs, one engine seat each; '' = 1), kv_floor (the bytes its
-- prompts take, with a block of output per sequence), kv_token (the bytes each token it
-- generates adds; '' or 0: it reserves its worst case, kv_bytes, whatever the engine's mode),
-- observed ('1' when its tokens are counted as they come, so it can grow: see job_cost),
-- affinity (whose prefixes it shares, for the engine that holds them: affinity_engine in
-- lib.lua; '' = none, it runs where the pick chooses).
-- Returns {'ok', enqueued_at, deadline, '' or what summon_loop said} or
-- {'rejected', reason, detail}.
local job_id, tenant, pool, cls = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
-- The counts and byte sizes are whole numbers as queue.py writes them (enqueue_args), and
-- are stored as they came: a number is converted only where it is compared.
local kv_bytes, payload = ARGV[10] + 0, ARGV[12]
local deadline = NOW + ARGV[11]

if redis.call('EXISTS', k_job(job_id)) == 1 then
  return {'rejected', 'duplicate_job', 'a job with this id already exists'}
end
-- The pool's engines first: a pool gets its copies of the tenants' policies with its first
-- engine (queue.py set_engine_policy).
local shape = pool_shape(pool)
if shape.engines == 0 then
  return {'rejected', 'no_engine', 'no engine serves pool ' .. pool}
end
local policy = redis.call('HMGET', k_tenant(tenant), 'quota_bytes', 'burst_bytes')
if not policy[1] then
  return {'rejected', 'unknown_tenant', 'the scheduler has no policy for tenant ' .. tenant}
end
local largest, predicts = shape.largest, shape.predicts
local kv_floor, kv_token = numor(ARGV[18], kv_bytes), num(ARGV[19])
if kv_bytes > largest then
  return {'rejected', 'larger_than_engine', string.format(
    'needs %d KV bytes; the largest engine of pool %s has %d', kv_bytes, pool, largest)}
end
-- Where a prediction may be reserved, the job needs room in the quota for its prompts only:
-- it then holds at most quota + burst, whatever it grows to (job_cost).
local ceiling = num(policy[1]) + num(policy[2])
local least = kv_bytes
if predicts and kv_token > 0 then least = math.min(kv_bytes, kv_floor) end
if least > ceiling then
  return {'rejected', 'larger_than_quota', string.format(
    'needs %d KV bytes; tenant %s may hold at most %d (quota + burst)', kv_bytes, tenant, ceiling)}
end
local max_waiting = num(ARGV[15])
if max_waiting > 0 then
  local waiting = 0
  for _, c in ipairs(CLASSES) do waiting = waiting + redis.call('LLEN', k_queue(pool, c, tenant)) end
  if waiting >= max_waiting then
    return {'rejected', 'too_many_waiting', string.format(
      '%d requests of tenant %s wait for pool %s, the most that may', waiting, tenant, pool)}
  end
end

local at, until_s = now_s(), fmt(deadline)
local fields = {'tenant', tenant, 'pool', pool, 'cls', cls,
  'prompt_tokens', ARGV[8], 'max_tokens', ARGV[9], 'kv_bytes', ARGV[10],
  'payload', payload, 'state', 'queued', 'enqueued_at', at, 'deadline', until_s,
  'attempt', '0', 'charged', '0', 'reserved', '0', 'inbox', ARGV[14] or '',
  'seqs', ARGV[17], 'kv_floor', ARGV[18], 'kv_token', ARGV[19],
  'observed', ARGV[20] or '', 'affinity', ARGV[21] or ''}
if (ARGV[16] or '') ~= '' then
  table.insert(fields, 'summary')
  table.insert(fields, ARGV[16])
end
redis.call('HSET', k_job(job_id), unpack(fields))
redis.call('ZADD', k_waiting(), until_s, job_id)
queue_job(job_id, pool, cls, tenant, false, ARGV[21] or '')
local loops = ''
if ARGV[13] ~= '' then loops = summon_loop(pool, ARGV[13]) end
return {'ok', at, until_s, loops}
