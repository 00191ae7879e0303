"""A stand-in for vLLM's OpenAI server, for supervisor tests: same command line, same
/health, /v1/completions and /metrics shapes, starts in a fraction of a second.

VLLM_FAKE_MODE: "ok" (default), "die" (print an error and exit 3 while starting),
"no_metrics" (healthy but without vllm:cache_config_info).
"""

import argparse
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODE = os.environ.get("VLLM_FAKE_MODE", "ok")
METRICS = (
    'vllm:num_requests_running{engine="0",model_name="%(name)s"} 0.0\n'
    'vllm:num_requests_waiting{engine="0",model_name="%(name)s"} 0.0\n'
    'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="64"} 1.0\n'
)


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
