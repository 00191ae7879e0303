-- An engine's policy changed, or it left its pool: the pools' shapes are computed again
-- (lib.lua pool_shape). ARGV[4..]: the pools.
for i = 4, #ARGV do
  redis.call('DEL', k_pool_shape(ARGV[i]))
  pool_shape(ARGV[i])
end
return 1
