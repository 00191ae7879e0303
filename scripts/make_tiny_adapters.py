"""Write LoRA adapters for the tiny demo model (scripts/make_tiny_model.py) into folders.

No adapter can be downloaded or trained here, so each is random: a PEFT LoRA of rank 8 on
the attention's q_proj and v_proj of both layers, large enough that an answer through it
differs from the base model's. The weights are written as safetensors directly (a JSON
header and the raw little-endian floats), so this runs on any Python, the platform's
included; vLLM reads it as it reads a PEFT checkpoint.

    python scripts/make_tiny_adapters.py [OUT_DIR] [NAME ...]

OUT_DIR defaults to var/adapters; the names to tiny-a and tiny-b. Each adapter's weights
are seeded by its name, so a run writes the same files again.
"""

from __future__ import annotations

import json
import random
import struct
import sys
from array import array
from pathlib import Path

DEFAULT_DIR = Path(__file__).resolve().parent.parent / "var" / "adapters"
DEFAULT_NAMES = ("tiny-a", "tiny-b")
# The tiny model's shapes (make_tiny_model.py): hidden 128, 2 heads of 64, 2 layers.
HIDDEN = 128
LAYERS = 2
RANK = 8
ALPHA = 16
TARGETS = ("q_proj", "v_proj")
SCALE = 0.5  # of each weight: B·A adds about as much as the base weights hold


def _tensor(rng: random.Random, rows: int, cols: int) -> array:
    return array("f", (rng.gauss(0.0, SCALE) for _ in range(rows * cols)))


def safetensors_bytes(tensors: dict[str, tuple[tuple[int, int], array]]) -> bytes:
    """The safetensors file of `tensors` (name -> (shape, float32 values))."""
    header: dict[str, object] = {}
    blobs: list[bytes] = []
    offset = 0
    for name, (shape, values) in tensors.items():
        if sys.byteorder != "little":
            values = array("f", values)
            values.byteswap()
        blob = values.tobytes()
        header[name] = {
            "dtype": "F32",
            "shape": list(shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    return struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs)


def write_adapter(folder: Path, name: str) -> None:
    rng = random.Random(f"gpushare-tiny-adapter:{name}")
    tensors: dict[str, tuple[tuple[int, int], array]] = {}
    for layer in range(LAYERS):
        for target in TARGETS:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            tensors[f"{prefix}.lora_A.weight"] = ((RANK, HIDDEN), _tensor(rng, RANK, HIDDEN))
            tensors[f"{prefix}.lora_B.weight"] = ((HIDDEN, RANK), _tensor(rng, HIDDEN, RANK))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": "tiny-llama",
        "r": RANK,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "target_modules": list(TARGETS),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "adapter_model.safetensors").write_bytes(safetensors_bytes(tensors))


def main(argv: list[str]) -> None:
    out = Path(argv[0]) if argv else DEFAULT_DIR
    for name in argv[1:] or DEFAULT_NAMES:
        write_adapter(out / name, name)
        print(out / name)


if __name__ == "__main__":
    main(sys.argv[1:])
