"""A stand-in for vLLM's OpenAI server that costs next to no CPU, for `bench/stand_in_overhead.py`.

Takes vLLM's command line (`-m vllm.entrypoints.openai.api_server --port ...`; the rest is
ignored) and answers /health, /metrics (the lines the platform reads), /v1/models,
/tokenize and whole (not streamed) completions, each after STAND_IN_DELAY_S seconds with
`max_tokens` words: the platform's own work can then be measured at the pace of a real
engine without an engine taking the CPU. Not an engine: no model, no tokens, no streaming.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from wire import serve_connection  # run as a script: its folder is on the path

DELAY_S = float(os.environ.get("STAND_IN_DELAY_S", "0.45"))
METRICS = (
    b'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="4096"} 1.0\n'
    b'vllm:num_requests_running{engine="0"} 0.0\n'
    b'vllm:num_requests_waiting{engine="0"} 0.0\n'
    b'vllm:kv_cache_usage_perc{engine="0"} 0.0\n'
)


def option(name: str, default: str) -> str:
    args = sys.argv[1:]
    return args[args.index(name) + 1] if name in args else default


NAME = option("--served-model-name", "stand-in")


def completion(path: str, body: bytes) -> dict[str, Any]:
    request = json.loads(body or b"{}")
    words = int(request.get("max_tokens") or 16)
    usage = {"prompt_tokens": 10, "completion_tokens": words, "total_tokens": 10 + words}
    text = "word " * words
    if path.endswith("/chat/completions"):
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
        kind = "chat.completion"
    else:
        choice, kind = {"index": 0, "text": text}, "text_completion"
    choice["finish_reason"] = "length"
    return {"id": "stand-in", "object": kind, "created": int(time.time()), "model": NAME,
            "choices": [choice], "usage": usage}  # fmt: skip


async def answer(path: str, body: bytes) -> tuple[bytes, bytes]:
    if path == "/metrics":
        return METRICS, b"text/plain"
    if path == "/health":
        return b"", b"application/json"
    if path == "/v1/models":
        models = {"object": "list", "data": [{"id": NAME, "object": "model"}]}
        return json.dumps(models).encode(), b"application/json"
    if path == "/tokenize":
        return json.dumps({"count": 10, "tokens": [1] * 10}).encode(), b"application/json"
    await asyncio.sleep(DELAY_S)
    return json.dumps(completion(path, body)).encode(), b"application/json"


async def respond(method: str, path: str, body: bytes) -> bytes:
    out, kind = await answer(path, body)
    return b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (
        kind,
        len(out),
        out,
    )


async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await serve_connection(reader, writer, respond)


async def main() -> None:
    server = await asyncio.start_server(
        serve, option("--host", "127.0.0.1"), int(option("--port", "8000"))
    )
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
