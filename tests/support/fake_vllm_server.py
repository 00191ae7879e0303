"""A stand-in for vLLM's OpenAI server, for supervisor tests: same command line, same
/health, /v1/completions and /metrics shapes, starts in a fraction of a second.

VLLM_FAKE_MODE: "ok" (default), "die" (print an error and exit 3 while starting),
"no_metrics" (healthy but without vllm:cache_config_info), "no_kv_memory" (print vLLM's
error for a KV cache that finds no memory and exit 1 while starting).

In every mode that serves, SIGUSR1 makes it print torch's out-of-memory error, as vLLM's
engine core does when a step runs out of GPU memory, and exit 1, as vLLM's server does
once its engine core has died.
"""

import argparse
import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODE = os.environ.get("VLLM_FAKE_MODE", "ok")
METRICS = (
    'vllm:num_requests_running{engine="0",model_name="%(name)s"} 0.0\n'
    'vllm:num_requests_waiting{engine="0",model_name="%(name)s"} 0.0\n'
    'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="64"} 1.0\n'
)

# vLLM's words (vllm/v1/core/kv_cache_utils.py) and torch's (torch.OutOfMemoryError).
KV_MEMORY_ERROR = (
    "(EngineCore_DP0 pid=1) ValueError: No available memory for the cache blocks. Try "
    "increasing `gpu_memory_utilization` when initializing the engine."
)
CUDA_OOM_ERROR = (
    "(EngineCore_DP0 pid=1) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
    "2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free."
)


def _out_of_memory(signum: int, frame: object) -> None:
    print(CUDA_OOM_ERROR, flush=True)
    print("(APIServer pid=1) Engine core proc EngineCore_DP0 died unexpectedly.", flush=True)
    os._exit(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-m")
    parser.add_argument("--model")
    parser.add_argument("--served-model-name")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    args, _ = parser.parse_known_args()
    print(f"fake vllm: loading {args.model}", flush=True)
    time.sleep(0.5)
    if MODE == "die":
        print("RuntimeError: fake engine could not load the model", flush=True)
        sys.exit(3)
    if MODE == "no_kv_memory":
        print(KV_MEMORY_ERROR, flush=True)
        print("RuntimeError: Engine core initialization failed. See root cause above.", flush=True)
        sys.exit(1)
    signal.signal(signal.SIGUSR1, _out_of_memory)
    name = args.served_model_name

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: str, kind: str = "application/json") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, "")
            elif self.path == "/metrics":
                text = "" if MODE == "no_metrics" else METRICS % {"name": name}
                self._send(200, text, "text/plain")
            else:
                self._send(404, "{}")

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = {"choices": [{"index": 0, "text": " fake", "finish_reason": "length"}]}
            self._send(200, json.dumps(body))

        def log_message(self, *args: object) -> None:
            pass

    print("fake vllm: serving", flush=True)
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
