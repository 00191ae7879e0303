-- Writes an engine's load (the samplers' reading) and the offline gate's hysteresis: the
-- gate closes when the load reaches offline_load_threshold and reopens only once the load
-- is below threshold - offline_gate_margin, so a load that hovers near the threshold does
-- not open and close the gate at every reading. ARGV[4]: engine id, ARGV[5]: load,
-- ARGV[6]: the signal the load came from (shown on the console).
local key = k_engine(ARGV[4])
local load = tonumber(ARGV[5])
local engine = redis.call('HMGET', key, 'offline_load_threshold', 'offline_gate_margin', 'load_closed')
local threshold, margin = num(engine[1]), num(engine[2])
local closed = load >= threshold or (engine[3] == '1' and load >= threshold - margin)
redis.call('HSET', key, 'load', ARGV[5], 'load_signal', ARGV[6], 'load_closed', closed and '1' or '0')
return closed and 1 or 0
