-- A reconciliation's first step, in the tenant's slot, KEYS[1] (`{t:<t>}:quota`): each pool
-- ever leased to, with the number of its latest grant there (each pool is then fenced at it,
-- lease_fence, and its answer settled, lease_settle). Returns {pool, number, pool, ...}.
local found = {}
local flat = redis.call('HGETALL', KEYS[1])
for i = 1, #flat, 2 do
  if string.sub(flat[i], 1, 4) == 'seq:' then
    table.insert(found, string.sub(flat[i], 5))
    table.insert(found, tonumber(flat[i + 1]))
  end
end
return found
