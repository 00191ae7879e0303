"""Write a tiny random-weight Llama model with a trained BPE tokenizer into a folder.

No weights can be downloaded here, so the demo engine serves this: a real Llama architecture
(vLLM loads it like any other) that is small enough to start in a minute on two CPU cores.
head_dim is 64 (hidden 128 / 2 heads) because the CPU attention kernel rejects head_dim 16.

Run it with the vLLM environment's interpreter (it has torch, transformers and tokenizers):
    "$(scripts/setup_vllm.sh)" scripts/make_tiny_model.py [var/models/tiny-llama]
Idempotent: a complete folder (marked by .gpushare-complete) is left as it is, whatever its
shape: give a model of another shape a folder of its own.

--layers, --hidden and --intermediate make a larger model of the same kind, for benchmarks
whose prefill must cost something on the CPU (bench/cache_affinity.py); the demo model is the
default shape. The heads stay 64 wide (hidden / 64 heads).
"""

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

DEFAULT_DIR = Path(__file__).resolve().parent.parent / "var" / "models" / "tiny-llama"
MARKER = ".gpushare-complete"
VOCAB_SIZE = 512
HEAD_DIM = 64
BOS, EOS, PAD = "<s>", "</s>", "<pad>"
# A Llama-3-like template, so /v1/chat/completions works on the demo model.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# Enough varied English for the BPE trainer to learn a 512-token vocabulary.
CORPUS = [
    "GPUs in inference are often falsely busy: memory is full of weights while compute idles.",
    "Batching requests together is the first lever; continuous batching is the second.",
    "Every request reserves its worst case of KV cache before it is admitted.",
    "Memory is allocated in units of 256 MiB so many models and tenants share one GPU.",
    "Interactive requests take the priority lane; offline batches run when the GPU is idle.",
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.",
    "Hello! How are you today? I am fine, thank you. What would you like to talk about?",
    "One, two, three, four, five, six, seven, eight, nine, ten. 0123456789",
    "The scheduler picks the tenant with the least virtual token counter whose job fits.",
    "A hot pool is always on; a cold pool is warmed and health-checked before traffic.",
]


def train_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[PAD, BOS, EOS, "<|system|>", "<|user|>", "<|assistant|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS * 20, trainer=trainer)
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=BOS, eos_token=EOS, pad_token=PAD
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(
    tokenizer: PreTrainedTokenizerFast, layers: int, hidden: int, intermediate: int
) -> LlamaForCausalLM:
    torch.manual_seed(0)
    heads = hidden // HEAD_DIM
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    # bfloat16, as vLLM would serve it anyway (it downcasts fp32 checkpoints), so the KV
    # cost model's bytes per token match what the engine allocates.
    return LlamaForCausalLM(config).to(torch.bfloat16)


def main(target: Path, layers: int, hidden: int, intermediate: int) -> None:
    if (target / MARKER).exists():
        print(f"tiny model already at {target}", file=sys.stderr)
        print(target)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename, so a half-written folder is never taken for a model.
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        build = Path(scratch) / "model"
        tokenizer = train_tokenizer()
        model = build_model(tokenizer, layers, hidden, intermediate)
        model.save_pretrained(build)
        tokenizer.save_pretrained(build)
        (build / MARKER).write_text("ok\n")
        if target.exists():
            shutil.rmtree(target)
        build.rename(target)
    print(f"tiny model written to {target}", file=sys.stderr)
    print(target)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", nargs="?", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128, help="a multiple of 64")
    parser.add_argument("--intermediate", type=int, default=256)
    args = parser.parse_args()
    if args.hidden <= 0 or args.hidden % HEAD_DIM:
        parser.error(f"--hidden must be a positive multiple of {HEAD_DIM}")
    return args


if __name__ == "__main__":
    args = parse_args()
    main(args.target.resolve(), args.layers, args.hidden, args.intermediate)
