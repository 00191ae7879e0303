-- Writes an engine's load (the samplers' reading) and the offline gate's hysteresis: the
-- gate closes when the load reaches offline_load_threshold and reopens only once the load
-- is below threshold - offline_gate_margin, so a load that hovers near the threshold does
-- not open and close the gate at every reading. ARGV[4]: engine id, ARGV[5]: load,
-- ARGV[6]: the signal the load came from (shown on the console).
-- For the `predict` mode's admission (engine_free): ARGV[7], the engine's own measure of its
-- KV in use (0..1; '' = none: the water level), and ARGV[8], the requests it preempted since the last reading
-- ('' = none known). A reading with preemptions scales the budget picks may fill down by
-- KV_BACKOFF (to KV_SCALE_MIN at least); each reading without them gives KV_RECOVER of it
-- back, up to the whole budget.
local KV_BACKOFF, KV_SCALE_MIN, KV_RECOVER = 0.8, 0.5, 0.05
local key = k_engine(ARGV[4])
local load = tonumber(ARGV[5])
local engine = redis.call('HMGET', key, 'offline_load_threshold', 'offline_gate_margin',
  'load_closed', 'kv_budget_bytes', 'kv_scale')
local threshold, margin = num(engine[1]), num(engine[2])
local closed = load >= threshold or (engine[3] == '1' and load >= threshold - margin)
local fields = {'load', ARGV[5], 'load_signal', ARGV[6], 'load_closed', closed and '1' or '0'}
local used = tonumber(ARGV[7] or '')
if used then
  -- What the engine holds beyond the reservations of its jobs now (growth nobody counted):
  -- picks count it on top of the reservations until the next reading.
  local reserved = num(redis.call('HGET', k_engine_use(ARGV[4]), 'reserved'))
  local excess = math.max(0, math.floor(used * num(engine[4])) - reserved)
  table.insert(fields, 'kv_excess_bytes')
  table.insert(fields, int(excess))
  table.insert(fields, 'kv_used_at')
  table.insert(fields, fmt(NOW))
end
local preempted = tonumber(ARGV[8] or '')
if preempted then
  local scale = tonumber(engine[5]) or 1
  if preempted > 0 then
    scale = math.max(KV_SCALE_MIN, scale * KV_BACKOFF)
  else
    scale = math.min(1, scale + KV_RECOVER)
  end
  table.insert(fields, 'kv_scale')
  table.insert(fields, fmt(scale))
end
redis.call('HSET', key, unpack(fields))
return closed and 1 or 0
