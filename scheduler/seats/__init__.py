"""Seats by class: the latency targets and fixed seat bounds each pool's engines hold."""
