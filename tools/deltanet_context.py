"""Decode speed against the context on Gated DeltaNet layers (docs/performance.md, "Qwen3.5-MoE:
decode against the context"): a layer of linear attention keeps a fixed state, so the tokens it
decodes cost the same at position 16 and at position 3,000, where a full-attention layer reads
every cached key and value.

    .venv/bin/python tools/deltanet_context.py [--out DIR] [--prompts 16,1024,3072] [--rounds 2]
        [--steps 32] [--threads 1]

Three random-init Qwen3.5-MoE checkpoints of one shape (transformers' own initialisation at a
fixed seed; hidden 512, 8 layers, 16 experts, top 4, a shared expert, vocabulary 8,000): *hybrid*
with the published schedule (three DeltaNet layers, then one full-attention layer) and
*attention* with every layer full attention (a model needs at least one attention layer). Each is built for host
(q8_0, context 4,096) and `./colibri bench` decodes `--steps` tokens after prompts of each length,
the models alternating within a round. Printed: decode tok/s per model and prompt length, and each
one's speed at the longest prompt over its speed at the shortest (1.00 is flat).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCHEDULES = {
    "hybrid": lambda n: ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)],
    "attention": lambda n: ["full_attention"] * n,
}
LAYERS = 8
CTX = 4096


def make_checkpoint(out: Path, layer_types: list[str], seed: int = 0) -> Path:
    if (out / "config.json").is_file():
        return out
    import torch
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    torch.manual_seed(seed)
    config = Qwen3_5MoeTextConfig(
        vocab_size=8000,
        hidden_size=512,
        num_hidden_layers=LAYERS,
        layer_types=layer_types,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        num_experts=16,
        num_experts_per_tok=4,
        moe_intermediate_size=256,
        shared_expert_intermediate_size=512,
        max_position_embeddings=CTX,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = Qwen3_5MoeForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(out, safe_serialization=True)
    return out


def bench(model: Path, prompt: int, steps: int, threads: int, out: Path) -> float:
    """Tokens per second of the decode's forward passes alone (bench's forward_only_tok_s: no
    sampling, logits digest or frame output, which do not depend on the context)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "generator.cli",
            "bench",
            "--board",
            "host",
            "--model",
            str(model),
            "--ctx",
            str(CTX),
            "--prompt-tokens",
            str(prompt),
            "--steps",
            str(steps),
            "--repeat",
            "1",
            "--threads",
            str(threads),
            "--out",
            str(out),
            "--json",
        ],  # fmt: skip
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"bench of {model.name} failed:\n{done.stderr[-2000:]}")
    return float(json.loads(done.stdout)["forward_only_tok_s"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/colibri-deltanet-context"))
    ap.add_argument("--prompts", default="16,1024,3072")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    prompts = [int(p) for p in args.prompts.split(",")]
    models = {name: make_checkpoint(args.out / name, schedule(LAYERS)) for name, schedule in SCHEDULES.items()}
    runs: dict[tuple[str, int], list[float]] = {}
    for r in range(args.rounds):
        for prompt in prompts:
            for name, model in models.items():
                tok_s = bench(model, prompt, args.steps, args.threads, args.out / f"build-{name}")
                runs.setdefault((name, prompt), []).append(tok_s)
                print(f"round {r + 1}: {name:<9} prompt {prompt:>5}: {tok_s:8.1f} forward tok/s", flush=True)
    print()
    print("| model | " + " | ".join(f"decode after {p:,} tokens" for p in prompts) + " | longest / shortest |")
    print("|---|" + "---:|" * (len(prompts) + 1))
    for name in models:
        medians = [statistics.median(runs[(name, p)]) for p in prompts]
        cells = " | ".join(", ".join(f"{v:.1f}" for v in runs[(name, p)]) for p in prompts)
        print(f"| {name} | {cells} | {medians[-1] / medians[0]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
