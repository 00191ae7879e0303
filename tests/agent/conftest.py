"""The engine supervisor's fixtures (a stand-in vLLM server, its device and engine)."""

from tests.scheduler.engines.test_supervisor import cpu, engine, fake_vllm, model_dir

__all__ = ["cpu", "engine", "fake_vllm", "model_dir"]
