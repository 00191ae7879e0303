"""Engines outlive the dispatch workers (issue 32): the node's engine agent started the
session's real vLLM CPU engine (tests/e2e/conftest.py); killing the dispatch worker (as a
rollout or a crash does) and starting it again leaves the engine serving: the same process,
never drained, answering a request through the platform once the worker is back. The
agent's stdout carries the engine's log, and the engine's own /metrics answers."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
import openai

from tests.e2e.conftest import MODEL, make_tenant
from tests.support.harness import Platform, engine_state, kill_process, start_process


def parent_pid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


class HealthWatch:
    """Asks the engine's /health every 0.2 s (directly, not through the platform) until
    stopped; counts the answers that were not 200."""

    def __init__(self, url: str) -> None:
        self.url, self.asked, self.missed = url, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.wait(0.2):
                self.asked += 1
                try:
                    ok = client.get(f"{self.url}/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.missed += not ok

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def chat(platform: Platform, key: str, timeout_s: float) -> str:
    """One chat through the platform, retried while the worker comes back (the web queues
    it; an answer needs a worker)."""
    client = openai.OpenAI(base_url=f"{platform.base_url}/v1", api_key=key, max_retries=0)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            answer = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "still there?"}],
                max_tokens=8, timeout=60,
            )  # fmt: skip
            return answer.choices[0].message.content or ""
        except openai.APIError:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)


def test_the_engine_keeps_serving_while_the_dispatch_worker_restarts(platform_server):
    platform = platform_server
    before = engine_state(platform, MODEL)
    assert before["status"] == "ready"
    agent = platform.processes["agent"]
    assert parent_pid(before["pid"]) == agent.pid  # the agent started it, not a worker
    _, key = make_tenant(platform)
    assert isinstance(chat(platform, key, timeout_s=60), str)
    engine_log = platform.workdir / "engines" / f"{MODEL}.log"
    log_before = engine_log.stat().st_size

    watch = HealthWatch(before["url"])
    try:
        kill_process(platform, "worker", signal.SIGKILL)  # its process group, no clean-up
        time.sleep(3)
        start_process(platform, "worker")
        answer = chat(platform, key, timeout_s=120)  # through the restarted worker
    finally:
        watch.stop()

    assert isinstance(answer, str)
    after = engine_state(platform, MODEL)
    assert after["pid"] == before["pid"]
    assert after["status"] == "ready"
    assert after["started_at"] == before["started_at"]
    assert after["detail"] == before["detail"]  # never "draining", never "stopping process"
    assert watch.asked > 10
    assert watch.missed == 0, f"{watch.missed} of {watch.asked} /health checks failed"
    # Nothing told the engine to shut down meanwhile.
    with engine_log.open("rb") as log:
        log.seek(log_before)
        since = log.read().decode(errors="replace")
    assert "shutdown" not in since.lower(), since[-2000:]
    # The restarted worker left the node's queue to the agent.
    worker_log = (platform.workdir / "worker.log").read_text(errors="replace")
    assert "gpushare.node." not in worker_log
    agent_log = (platform.workdir / "agent.log").read_text(errors="replace")
    assert "gpushare.node." in agent_log


def test_the_agent_writes_the_engines_log_to_its_stdout_and_each_engine_is_scraped(
    platform_server,
):
    agent_log = (platform_server.workdir / "agent.log").read_text(errors="replace")
    prefix = f"[engine {MODEL}] "
    lines = [line for line in agent_log.splitlines() if line.startswith(prefix)]
    assert any("=== gpushare: starting engine" in line for line in lines)
    assert any("vllm" in line.lower() for line in lines)
    state = engine_state(platform_server, MODEL)
    url = f"{state['url']}/metrics"  # the engine's own, with its key only
    assert httpx.get(url, timeout=10).status_code == 401
    key = platform_server.manage("engine", "key", MODEL).strip()
    metrics = httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=10)
    assert metrics.status_code == 200
    assert "vllm:num_requests_running" in metrics.text
