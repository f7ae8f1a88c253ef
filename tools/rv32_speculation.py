"""Exact speculative decoding on the emulated MCU: what it does to the instructions per decoded token
(qemu-rv32 counts them exactly) and to the ESP32-P4 speed bench predicts from them (docs/performance.md,
"qemu-rv32: speculative decoding").

    .venv/bin/python tools/rv32_speculation.py [--model models/kjv-tiny] [--steps 128] [--speculate 7]

The MCU boards' files set no `speculate_tokens`, so no plan for them makes room for it; this tool
builds qemu-rv32 with `speculate_tokens = 8` from a copy of its board file that adds it (written
into --out and given by its path; targets/qemu-rv32.toml is not changed). Its
`speculate_pass_cost` is measured first, on the board as it is: a prompt of n tokens is one prefill
pass of n tokens (prefill_batch 8), and its instructions over one token's are the cost of a pass of
n. (A speculative pass also computes the logits after each of its tokens, which a prefill pass does
for its last one only, so the curve is a little cheaper than the passes it sizes drafts for.) The
same runs are made with every pass cost 1.0 (each match drafts all it can): what a draft costs
when one is made.

Then each prompt is decoded greedily, plainly and with `--speculate N`, on the same firmware: the
tokens and every step's logits hash must be the same (one hashed run each), and the instructions
per decoded token are those of runs that hash nothing, as bench's are. The ESP32-P4 prediction is
bench's: a token takes the longer of its instructions at the board's clock and its weight reads,
which with speculation are one pass's bytes per pass, not per token.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from speculation_bench import decode, prepared_build  # noqa: E402  (tools/, this script's folder)

from generator.bench import predict_speed, predicted_timing, weight_bytes_per_token  # noqa: E402
from generator.boards import load_board  # noqa: E402

PASS_TOKENS = 8  # the variant's speculate_tokens: the board's prefill batch


def ruth(words: int) -> str:
    """The first words of the bundled Book of Ruth's text (docs/texts/ruth-kjv.txt, after its titles)."""
    text = (REPO / "docs" / "texts" / "ruth-kjv.txt").read_text()
    return " ".join(text[text.index("Now it came to pass") :].split()[:words])


def prompts() -> dict[str, str]:
    source = ruth(40)  # ~100 tokens of this model's: the prompt and 128 steps fit its 256 positions
    return {
        # the passage, then its first words again: the model's continuation can copy the passage
        "a passage begun again": f"{source}\n\n{ruth(12)}",
        # the book's opening words: the continuation is the model's own text
        "free text": ruth(8),
    }


def pass_costs(model: Path, prompt_file: Path, out: Path) -> tuple[float, ...]:
    """What a prefill pass of 1 .. PASS_TOKENS tokens costs against one of a single token, in
    exact instructions on the board as it is."""
    prepared, built = prepared_build(model, prompt_file, 1, 0, 1, out, board="qemu-rv32", ctx=None)
    prompt = prepared.tokenizer.encode(ruth(40))
    counts = []
    for n in range(1, PASS_TOKENS + 1):
        _, stats = decode(prepared, built, prompt[:n], 1, 0, 1, digests=False)
        counts.append(stats.prefill_instructions_per_token * n)
    costs = [round(c / counts[0], 3) for c in counts]
    for i in range(1, len(costs)):  # the board file's rule: never falling
        costs[i] = max(costs[i], costs[i - 1])
    return tuple(costs)


def speculating_board(costs: tuple[float, ...], out: Path) -> str:
    """The path of a copy of qemu-rv32's board file with speculate_tokens and these pass costs."""
    text = load_board("qemu-rv32").path.read_text()
    anchor = "\nprefill_batch = "
    if anchor not in text or "speculate_tokens" in text:
        raise SystemExit("targets/qemu-rv32.toml changed: this tool adds speculate_tokens after its prefill_batch")
    at = text.index("\n", text.index(anchor) + 1)
    lines = f"\nspeculate_tokens = {PASS_TOKENS}\nspeculate_pass_cost = [{', '.join(map(str, costs))}]"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "qemu-rv32-speculating.toml"
    path.write_text(text[:at] + lines + text[at:])
    return str(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=REPO / "models" / "kjv-tiny")
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--speculate", type=int, default=PASS_TOKENS - 1)
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "colibri-rv32-speculation")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    prompt_file = args.out / "prompt.txt"
    prompt_file.write_text(prompts()["free text"])

    measured = pass_costs(args.model, prompt_file, args.out / "board")
    print("pass costs, 1 ..", PASS_TOKENS, "tokens:", ", ".join(f"{c:.3f}" for c in measured), flush=True)
    print()
    print(
        "| pass costs the drafts are sized by | prompt | decoded tokens | instructions per token, plain | "
        "with speculation | ratio | acceptance | tokens per pass | ESP32-P4 predicted tok/s, plain | "
        "with speculation |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    # the measured curve, and none (every match drafts all it can): what a draft costs when made
    for label, costs in (("measured", measured), ("all 1.0", (1.0,) * PASS_TOKENS)):
        out = args.out / ("variant-" + label.replace(" ", "-"))
        variant = speculating_board(costs, out)
        prepared, built = prepared_build(
            args.model, prompt_file, args.steps, args.speculate, 1, out, board=variant, ctx=None
        )
        if prepared.plan.speculate_tokens != PASS_TOKENS:
            raise SystemExit(
                f"the plan made room for {prepared.plan.speculate_tokens} tokens a pass, not {PASS_TOKENS}"
            )
        timing = predicted_timing(prepared.board)
        weights = weight_bytes_per_token(prepared.plan)
        for name, text in prompts().items():
            prompt = prepared.tokenizer.encode(text)
            a, _ = decode(prepared, built, prompt, args.steps, 0, 1, digests=True)
            b, _ = decode(prepared, built, prompt, args.steps, args.speculate, 1, digests=True)
            if a.tokens != b.tokens or a.digests != b.digests:
                raise SystemExit(f"{name}: speculative decoding changed the tokens or logits")
            _, plain = decode(prepared, built, prompt, args.steps, 0, 1, digests=False)
            _, fast = decode(prepared, built, prompt, args.steps, args.speculate, 1, digests=False)
            spec = fast.speculation or {}
            tokens_per_pass = spec.get("tokens_per_pass", 1.0) or 1.0
            p = predict_speed(timing, plain.decode_instructions_per_token, weights)
            s = predict_speed(timing, fast.decode_instructions_per_token, round(weights / tokens_per_pass))
            print(
                f"| {label} | {name} | {len(a.tokens)} | {plain.decode_instructions_per_token:,.0f} | "
                f"{fast.decode_instructions_per_token:,.0f} | "
                f"{fast.decode_instructions_per_token / plain.decode_instructions_per_token:.3f} | "
                f"{spec.get('acceptance', 0.0):.2f} | {tokens_per_pass:.2f} | {p.tok_s:.1f} | {s.tok_s:.1f} |",
                flush=True,
            )
    print()
    print(f"ESP32-P4 model: {timing.describe()}; {weights:,} weight bytes a pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
