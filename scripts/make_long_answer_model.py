"""A random-weight Llama with much KV per token whose answers end at a chosen mean length,
written into a folder (var/models/...): the engine of bench/reservation.py and of
tests/e2e/test_kv_reservation.py, where the KV reservation binds as it does on a GPU.

Run it with the vLLM environment's interpreter (torch, transformers, tokenizers):

    "$(bash scripts/setup_vllm.sh | tail -1)" scripts/make_long_answer_model.py \\
        var/models/reservation-llama --layers 4 --kv-heads 8 --head-dim 128 \\
        --max-len 8192 --mean-output 200

What differs from scripts/make_tiny_model.py (whose tokenizer and chat template it reuses):

- KV per token: 2 x layers x kv_heads x head_dim x 2 bytes (bfloat16). The defaults, 4 x 8 x
  128, make 16 KiB a token, so 1 GiB of KV space (the least a CPU engine can have:
  VLLM_CPU_KVCACHE_SPACE is whole GiB) holds 65,536 tokens: 8 requests of 8,192 tokens. The
  hidden size stays 128 (head_dim is explicit in the config), so compute stays small.
- Answers end by themselves: the output distribution is the same at every step, whatever the
  context. Every token's embedding carries a large constant in dimension 0, no layer writes
  that dimension (row 0 of every o_proj and down_proj is zero), and the final norm keeps
  dimension 0 alone, so the last hidden state is (nearly) the same vector at every position.
  The untied lm_head then gives every ordinary token the same logit (0), the other special
  tokens a very low one, and EOS one set so that P(EOS) per step = 1 / mean_output: sampled
  at temperature 1, answers have a geometric length distribution of that mean (p50 about
  0.69 x mean, p95 about 3 x mean), cut at the model's length. Greedy sampling (temperature
  0) would never end: the benchmark sends temperature 1.
- max_position_embeddings is --max-len.

Idempotent: a folder whose marker holds the same parameters is left as it is; otherwise it is
rebuilt. Prints the folder on its last line.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_model import train_tokenizer

MARKER = ".gpushare-complete"
# Dimension 0 of every embedding: large beside what the layers write into the other
# dimensions (about 0.1 each with these random weights), so that the final RMS norm, which
# divides by the norm of the whole vector, leaves dimension 0 almost the same everywhere.
CONSTANT = 16.0
BANNED_LOGIT = -30.0


def parameters(args: argparse.Namespace) -> dict[str, float | int]:
    return {
        "layers": args.layers,
        "kv_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "hidden": args.hidden,
        "max_len": args.max_len,
        "mean_output": args.mean_output,
        "version": 1,
    }


def build(args: argparse.Namespace, target: Path) -> None:
    tokenizer = train_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.kv_heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=args.max_len,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = CONSTANT
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0, :] = 0.0
            layer.mlp.down_proj.weight[0, :] = 0.0
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        # The last hidden state is about (sqrt(hidden), 0, ..., 0): logit_i = W[i, 0] * h0.
        h0 = math.sqrt(args.hidden)
        vocab = len(tokenizer)
        special = set(tokenizer.all_special_ids) | set(
            tokenizer.convert_tokens_to_ids(["<|system|>", "<|user|>", "<|assistant|>"])
        )
        ordinary = vocab - len(special)
        p = 1.0 / args.mean_output
        eos_logit = math.log(p * ordinary / (1.0 - p))
        head = torch.zeros(vocab, args.hidden)
        for token in special:
            head[token, 0] = BANNED_LOGIT / h0
        head[tokenizer.eos_token_id, 0] = eos_logit / h0
        model.lm_head.weight.copy_(head)
    model = model.to(torch.bfloat16)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--max-len", type=int, default=8192, help="max_position_embeddings")
    parser.add_argument("--mean-output", type=float, default=200.0, help="tokens, 1/P(EOS)")
    args = parser.parse_args()
    if args.mean_output <= 1:
        parser.error("--mean-output must be over 1")
    target = args.folder.resolve()
    wanted = json.dumps(parameters(args), sort_keys=True)
    marker = target / MARKER
    if marker.exists() and marker.read_text().strip() == wanted:
        print(f"model already at {target}", file=sys.stderr)
        print(target)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        folder = Path(scratch) / "model"
        build(args, folder)
        (folder / MARKER).write_text(wanted + "\n")
        if target.exists():
            shutil.rmtree(target)
        folder.rename(target)
    print(f"model written to {target}: {wanted}", file=sys.stderr)
    print(target)


if __name__ == "__main__":
    main()
