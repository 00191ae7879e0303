"""A node's engine agent (issue 32): the one long-running process on a node that starts,
drains, stops and crash-checks the node's vLLM engines (see `agent.main`)."""
