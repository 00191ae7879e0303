"""vLLM engines: how to launch one, talk to one, read its metrics, and supervise it."""
