"""Write a tiny random-weight Llama model with a trained BPE tokenizer into a folder.

No weights can be downloaded here, so the demo engine serves this: a real Llama architecture
(vLLM loads it like any other) that is small enough to start in a minute on two CPU cores.
head_dim is 64 (hidden 128 / 2 heads) because the CPU attention kernel rejects head_dim 16.

Run it with the vLLM environment's interpreter (it has torch, transformers and tokenizers):
    "$(scripts/setup_vllm.sh)" scripts/make_tiny_model.py [var/models/tiny-llama]
Idempotent: a complete folder (marked by .gpushare-complete) is left as it is.
"""

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


def build_model(tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    # bfloat16, as vLLM would serve it anyway (it downcasts fp32 checkpoints), so the KV
    # cost model's bytes per token match what the engine allocates.
    return LlamaForCausalLM(config).to(torch.bfloat16)


def main(target: Path) -> None:
    if (target / MARKER).exists():
        print(f"tiny model already at {target}", file=sys.stderr)
        print(target)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename, so a half-written folder is never taken for a model.
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        build = Path(scratch) / "model"
        tokenizer = train_tokenizer()
        model = build_model(tokenizer)
        model.save_pretrained(build)
        tokenizer.save_pretrained(build)
        (build / MARKER).write_text("ok\n")
        if target.exists():
            shutil.rmtree(target)
        build.rename(target)
    print(f"tiny model written to {target}", file=sys.stderr)
    print(target)


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else DEFAULT_DIR)
