"""Write a random-init Mixtral-shaped bf16 checkpoint (config.json + safetensors) for measuring
generation at real sizes (docs/performance.md, "Generation at real sizes").

    .venv/bin/python tools/make_checkpoint.py OUT_DIR [--layers 8] [--hidden 768] [--intermediate 2048]
        [--experts 8] [--top-k 2] [--vocab 32000] [--shard-size 1GB] [--seed 0]

Defaults give mixtral-0.36b-bf16 (hidden 768, 8 experts, top-2, 8 layers: 0.36 B parameters,
727 MB); --layers 26 --shard-size 1GB gives mixtral-2g-bf16 (1.07 B parameters, 2.1 GB in three
shards). The weights are transformers' own random initialisation at a fixed seed: the same
command writes the same files. Needs torch and transformers (the test dependencies).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Each size option, the MixtralConfig field it sets, and its default.
SIZES = {
    "layers": ("num_hidden_layers", 8),
    "hidden": ("hidden_size", 768),
    "intermediate": ("intermediate_size", 2048),
    "heads": ("num_attention_heads", 12),
    "kv-heads": ("num_key_value_heads", 4),
    "experts": ("num_local_experts", 8),
    "top-k": ("num_experts_per_tok", 2),
    "vocab": ("vocab_size", 32000),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    for option, (_, default) in SIZES.items():
        ap.add_argument(f"--{option}", type=int, default=default)
    ap.add_argument(
        "--shard-size", default="5GB", help="save_pretrained's max_shard_size (default: one file below 5 GB)"
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(args.seed)
    sizes = {field: getattr(args, option.replace("-", "_")) for option, (field, _) in SIZES.items()}
    config = MixtralConfig(**sizes, max_position_embeddings=4096, tie_word_embeddings=False)
    model = MixtralForCausalLM(config).to(torch.bfloat16).eval()
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(args.out, safe_serialization=True, max_shard_size=args.shard_size)
    size = sum(p.stat().st_size for p in args.out.glob("*.safetensors"))
    print(f"{args.out}: {params / 1e9:.3f} B parameters, {size / 1e6:.0f} MB of safetensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
