"""A run's speeds from its stats frame: tokens per second (wall clock) or instructions per token
(boards that count them), as run, verify and bench report them."""

from __future__ import annotations

from .session import RunResult


def rates(result: RunResult) -> dict:
    s = result.stats
    prefill_us, decode_us = int(s.get("prefill_us", 0)), int(s.get("decode_us", 0))
    forward_us = int(s.get("forward_us", 0))
    n_prompt, n_decode = int(s.get("prompt", 0)), int(s.get("decode", 0))
    return {
        "prompt_tokens": n_prompt,
        "prefill_seconds": prefill_us / 1e6,
        "prefill_tok_s": n_prompt / (prefill_us / 1e6) if prefill_us else None,
        "decode_forward_passes": n_decode,
        "decode_seconds": decode_us / 1e6,
        "decode_tok_s": n_decode / (decode_us / 1e6) if decode_us and n_decode else None,
        # The forward passes alone, without sampling, logits hashing and frame output.
        "forward_tok_s": n_decode / (forward_us / 1e6) if forward_us and n_decode else None,
        # Exact retired instructions, on boards that count them (qemu-rv32, esp32p4).
        "prefill_instructions_per_token": int(s["prefill_instret"]) / n_prompt if "prefill_instret" in s and n_prompt else None,
        "decode_instructions_per_token": int(s["decode_instret"]) / n_decode if "decode_instret" in s and n_decode else None,
    }


def speed_text(r: dict) -> str:
    if r["decode_instructions_per_token"]:
        return f"{r['decode_instructions_per_token'] / 1e6:.2f} M instructions/token"
    return f"{r['decode_tok_s']:.1f} tok/s" if r["decode_tok_s"] else ""
