"""A node's engine agent (issue 32): `python -m agent`.

The engines of a node used to be started, drained, stopped and crash-checked by the same
Celery workers that run the tenants' jobs, so in a container a rollout of the workers killed
every engine without draining it. The agent is their own long-running process, one per
node (its own service in compose, a DaemonSet holding the GPUs in Kubernetes, beside the
others in `make run`):

- a Celery worker that consumes only the node's queue `gpushare.node.<node name>` (the
  console's starts and stops, the scaler's starts and drains, the dispatch workers' "this
  engine did not answer" checks), with the settings' GPUSHARE_ENGINE_AGENT set so that no
  other worker takes that queue and the periodic jobs stay with the workers; it runs the
  tasks sent to that queue and refuses any other (`agent.tasks_allowed`);
- a thread that checks the node's live engines every GPUSHARE_AGENT_CHECK_INTERVAL_S
  (process alive, /health of ready ones) and keeps a heartbeat in Redis
  (`scheduler.engines.agents.agent_of`);
- a thread that writes every line of the engines' logs to stdout, after the engine's name
  (`agent.logtail`), so the node's log collector has them.

The dispatch workers only call the engines over HTTP; restarting them leaves the engines
serving. With --drain-on-exit (where the engines die with the agent: a pod, a container) the
agent drains and stops its node's engines when it is told to stop, after the queued work it
took has ended.
"""

from __future__ import annotations

import argparse
import os
import threading
from pathlib import Path


def worker_argv(*, queue: str, node: str, concurrency: int, loglevel: str) -> list[str]:
    """The Celery worker's command line: only the node's queue, threads (a start waits
    minutes on one), none of the events nothing here watches."""
    return [
        "worker",
        "--queues", queue,
        "--hostname", f"engine-agent@{node}",
        "--pool", "threads",
        "--concurrency", str(concurrency),
        "--loglevel", loglevel,
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m agent", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--concurrency", type=int, default=8, help="engine starts and stops at once (8)"
    )
    parser.add_argument("--loglevel", default="INFO")
    parser.add_argument(
        "--drain-on-exit",
        action="store_true",
        help="drain and stop this node's engines when the agent stops (their processes end "
        "with it: a Kubernetes pod, a compose container)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["GPUSHARE_ENGINE_AGENT"] = "1"
    # The periodic jobs (flush, housekeeping, scaler, sampler) are the dispatch workers'.
    os.environ["GPUSHARE_WORKER_TICK"] = "0"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.conf import settings

    from agent.engines import check_in_thread, check_interval_s, drain_node
    from agent.logtail import LogFollower, as_json, follow_in_thread, prefixed, stdout_writer
    from agent.tasks_allowed import run_allowed_tasks_only
    from config.celery import app
    from scheduler.engines.agents import heartbeat_end
    from scheduler.gpu_inventory import node_name
    from scheduler.worker_tasks import node_queue
    from tracing.setup import configure as configure_tracing

    run_allowed_tasks_only(app)
    configure_tracing("agent")  # where the OTEL_* settings ask for it (tracing.setup)
    node = node_name(settings.GPUSHARE_NODE_NAME)
    stop = threading.Event()
    shown = as_json if settings.GPUSHARE_LOG_FORMAT == "json" else prefixed
    follower = LogFollower(Path(settings.GPUSHARE_ENGINE_DIR), stdout_writer(), shown)
    threads = [
        follow_in_thread(follower, stop),
        check_in_thread(node, stop, check_interval_s()),
    ]
    argv_ = worker_argv(
        queue=node_queue(node), node=node, concurrency=args.concurrency, loglevel=args.loglevel
    )
    try:
        app.worker_main(argv_)
    finally:
        if args.drain_on_exit:
            drain_node(node)
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
        heartbeat_end(node)
    return 0
