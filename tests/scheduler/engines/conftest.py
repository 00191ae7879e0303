"""The engine supervisor's fixtures (a stand-in vLLM server, its device and engine), for the
tests of what drives the supervisor: the engine agents' actions."""

from tests.scheduler.engines.test_supervisor import cpu, engine, fake_vllm

__all__ = ["cpu", "engine", "fake_vllm"]
