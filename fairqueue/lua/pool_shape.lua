-- An engine's policy changed, or it left its pool: the pool's shape is computed again
-- (lib.lua pool_shape). ARGV[4]: the pool.
redis.call('DEL', k_pool_shape(ARGV[4]))
pool_shape(ARGV[4])
return 1
