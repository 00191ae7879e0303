"""KV reservation: whether each pool's jobs reserve their worst case or a prediction."""
