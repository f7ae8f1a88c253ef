"""Exact speculative decoding on the real SmolLM2-135M-Instruct (docs/performance.md, "Speculative
decoding"): plain decoding and `--speculate N`, alternating, on tasks whose answer copies its input
and on free text; the tokens must be the same, and the speedup, the acceptance and the tokens per
forward pass are printed.

    .venv/bin/python tools/speculation_bench.py [--model GGUF] [--speculate 7] [--rounds 3]
        [--repeat 1] [--steps 256] [--threads 1] [--task NAME ...]

--model defaults to the SmolLM2-135M-Instruct Q4_1 file the tests fetch (tools/fetch_models.py).
Each task is a chat turn in the model's ChatML format, decoded greedily on host by the firmware
`./colibri run --greedy --ctx 1024` builds (built once). The bits are checked once per task with
every step's logits hashed, as `run --json` and `verify` do; the timed runs hash nothing, as a plain
`run` does (hashing a 49,152-value row costs ~0.9 ms a token, more than a tenth of a token's time,
and would be counted on both sides). The figure is decode tok/s (every token after the first over
the decode's wall time); each round runs plain and speculative decoding `--repeat` times each,
alternating, and takes each side's median.

The ceiling column is what a drafter that copies from the context could reach at best on the same
answer: one that knew the answer would draft, before each pass, the longest run of it (up to
--speculate tokens) found anywhere in the context so far, passes sized to cost the least in all,
priced with the board's speculate_pass_cost. No drafter that only copies does better, so it says
how much of a task's room the drafting rule takes, and when a target is out of any copier's reach.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from generator import job  # noqa: E402
from generator.device.session import RunRequest  # noqa: E402
from generator.verify import run_stats  # noqa: E402

DEFAULT_MODEL = Path.home() / ".cache" / "colibri-test-models" / "SmolLM2-135M-Instruct.Q4_1.gguf"

PARAGRAPH = (
    "The river town woke slowly in the grey light of early spring. Fishermen pulled their boats "
    "onto the gravel and spread their nets to dry along the low stone wall, while the baker opened "
    "his shutters and set the first loaves on the sill to cool. Children ran down the narrow lane "
    "toward the school, their boots loud on the wet cobbles, and an old dog followed them as far as "
    "the bridge before it turned back to sleep in the doorway of the inn. Across the water the mill "
    "wheel began to turn, and the sound of it carried over the fields where the farmers were already "
    "at work with their horses. By the time the church bell rang eight, the market square was full "
    "of carts and voices, of apples and cheese and cloth, and the smell of smoke from the "
    "blacksmith's forge hung over everything. Nobody in the town could remember a winter as long as "
    "the one that had just ended, and everyone seemed determined to make up for the lost weeks. The "
    "schoolmaster stood at his window and watched the square fill, thinking of the letter he had to "
    "write to his sister in the city, and of how little there was to tell her that she would not "
    "find dull. Still, he thought, she would want to know that the river had not flooded this year, "
    "that the new bridge had held, and that the swallows had come back to the eaves of the old barn "
    "on the hill, as they did every year, as if nothing in the world had changed at all."
)
MISSPELT = (
    "Teh comittee met on Tuesdy to discus the new libary. Most of the memebers agreed that the "
    "bulding was to small for the growing town, and that a new one shoud be built near the scool. "
    "The treasurer said there was enuogh money for the plans but not for the constuction, so the "
    "comittee decided to ask the council for a grant. Everyone was pleased with the desicion and "
    "the meeting ended erly."
)
RECORD = (
    "Customer record 4471. Name: Margaret Ellen Hughes. Born: 14 March 1962 in Cardiff, Wales. "
    "Address: 27 Orchard Row, Bristol BS8 4QT, United Kingdom. Phone: +44 117 496 0123. Email: "
    "m.hughes@example.org. Account opened: 2 September 2011. Plan: Premium Family, renewed yearly. "
    "Last payment: 18 January 2026, 149.00 GBP by direct debit. Notes: prefers letters to phone "
    "calls; has asked twice about the loyalty discount."
)
TASKS = {
    "rewrite with one word changed": f"Rewrite the following paragraph exactly, changing only the word "
    f'"river" to "harbour" everywhere it appears.\n\n{PARAGRAPH}',
    "fix the spelling": f"Correct the spelling mistakes in this text and give back the whole corrected "
    f"text.\n\n{MISSPELT}",
    "extract fields": "From this record, list the name, the date of birth, the address, the phone "
    f"number, the email and the last payment, one per line as 'field: value'.\n\n{RECORD}",
    # The two above, asked so that SmolLM2-135M's answer copies its input: to the first it answers
    # with a list of corrections that falls into repeating one line, to the second with numbered
    # lines that fall into repeating "2011"; to these, with the text corrected (a correction every
    # few words) and with the record's fields copied (then the copy again).
    "fix the spelling, the text only": "Rewrite this text with the spelling mistakes corrected. Write "
    f"only the corrected text.\n\n{MISSPELT}",
    "copy the record's fields": "Copy the following record as a list with one field per line, in "
    f"the form 'Field: value', keeping the values exactly as written.\n\n{RECORD}",
    "free text": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def chat(user: str) -> str:
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


def prepared_build(
    model: Path, prompt_file: Path, steps: int, speculate: int, threads: int, out: Path, board: str = "host",
    ctx: int | None = 1024,
):  # fmt: skip
    """The firmware `./colibri run --greedy --ctx 1024` builds for this model, built once (ctx None:
    the board's default)."""
    options = job.JobOptions(
        board=board, model=model, prompt_file=prompt_file, steps=steps, greedy=True, ctx=ctx, speculate=speculate,
        threads=threads, out=out, quiet=True,
    )  # fmt: skip
    prepared = job.prepare_run(options)
    return prepared, job.build(prepared)


def decode(prepared, built, prompt: list[int], steps: int, speculate: int, threads: int, digests: bool):
    """One greedy decode of the prompt; digests: every step's logits hashed (the bits' check)."""
    request = RunRequest(prompt, steps, prepared.sampling, True, threads, digests=digests, speculate=speculate)
    result = job.run_turn(prepared, built, request)
    return result, run_stats(result, prepared.board, request, prepared.plan)


def ceiling(prompt: list[int], answer: list[int], pass_cost: list[float], max_draft: int) -> float:
    """Plain decode's passes over the fewest a clairvoyant copier needs for the answer after its
    first token (priced with pass_cost[n - 1] for a pass of n tokens; 1.0 means no copy helps).
    The pass after answer[i] may draft answer[i + 1 .. i + l] if that run occurs in prompt +
    answer[: i + 1]; it yields l + 1 tokens (the draft and the token after it)."""
    history: list[int] = []
    runs: set[tuple[int, ...]] = set()

    def add(token: int) -> None:
        history.append(token)
        for n in range(1, min(max_draft, len(history)) + 1):
            runs.add(tuple(history[-n:]))

    for token in prompt:
        add(token)
    draftable = []
    for i, token in enumerate(answer):
        add(token)
        n = 0
        while n < max_draft and i + n + 1 < len(answer) and tuple(answer[i + 1 : i + n + 2]) in runs:
            n += 1
        draftable.append(n)
    last = len(answer) - 1
    if last <= 0:
        return 1.0
    cost = [0.0] * len(answer)  # cost[i]: the least for answer[i + 1 ..] once answer[i] is known
    for i in range(last - 1, -1, -1):
        cost[i] = min(pass_cost[n] + cost[i + n + 1] for n in range(min(draftable[i], last - 1 - i) + 1))
    return last / cost[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--speculate", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each side in a round; its median is the round's")
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--task", action="append", choices=sorted(TASKS), help="only these tasks (repeatable)")
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "colibri-speculation")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    prompt_file = args.out / "prompt.txt"
    prompt_file.write_text(chat(TASKS["free text"]))
    prepared, built = prepared_build(
        args.model, prompt_file, args.steps, args.speculate, args.threads, args.out / "build"
    )
    rows = []
    for task in args.task or list(TASKS):
        prompt = prepared.tokenizer.encode(chat(TASKS[task]))
        a, _ = decode(prepared, built, prompt, args.steps, 0, args.threads, digests=True)
        b, checked = decode(prepared, built, prompt, args.steps, args.speculate, args.threads, digests=True)
        if a.tokens != b.tokens or a.digests != b.digests:
            raise SystemExit(f"{task}: speculative decoding changed the tokens or logits")
        spec = checked.to_json()["speculation"]
        plain, fast = [], []
        for r in range(args.rounds):
            runs: dict[int, list[float]] = {0: [], args.speculate: []}
            for _ in range(args.repeat):
                for k in runs:
                    result, stats = decode(prepared, built, prompt, args.steps, k, args.threads, digests=False)
                    if result.tokens != a.tokens:
                        raise SystemExit(f"{task}: a timed run decoded other tokens")
                    runs[k].append(stats.decode_tok_s)
            plain.append(statistics.median(runs[0]))
            fast.append(statistics.median(runs[args.speculate]))
            print(f"{task}, round {r + 1}: plain {plain[-1]:.1f}, speculative {fast[-1]:.1f} tok/s", flush=True)
        ratios = [f / p for f, p in zip(fast, plain)]
        costs = list(prepared.board.speculate_pass_cost)
        best = ceiling(prompt, a.tokens, costs, min(args.speculate, len(costs) - 1))
        rows.append((task, len(a.tokens), plain, fast, ratios, spec, best))
    print()
    print(
        "| task | tokens | plain tok/s | speculative tok/s | ratio, round by round | acceptance | tokens per pass "
        "| ceiling |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for task, n, plain, fast, ratios, spec, best in rows:
        print(
            f"| {task} | {n} | {', '.join(f'{v:.1f}' for v in plain)} | {', '.join(f'{v:.1f}' for v in fast)} | "
            f"{', '.join(f'{v:.2f}' for v in ratios)} (median {statistics.median(ratios):.2f}) | "
            f"{spec['acceptance']:.2f} | {spec['tokens_per_pass']:.2f} | {best:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
