"""The bits of every test model on every board, written down so that a change that must not change
them (a redesign, a refactor of the C runtime) can be shown not to.

    .venv/bin/python tools/bits_snapshot.py snapshot OUT.json [--work DIR] [--boards host,linux-aarch64,qemu-rv32]
        [--quants f32,q8_0,q4_0,q4_1] [--models kjv-tiny,llama_gqa_linear,...] [--steps 6]
    .venv/bin/python tools/bits_snapshot.py compare BEFORE.json AFTER.json [--subset]

`snapshot` makes each of tests/models.py's oracle checkpoints (fixed seeds) and takes the bundled
default model, then for every model x quantization x board runs `./colibri run --json` on a fixed
prompt (greedy, past end-of-sequence) and records the weight image's SHA-256, the tokens, every
step's logits SHA-256 and the MoE routing counts the firmware reports. A run that fails is
recorded with its exit code and last line, so the same refusal before and after compares equal.
`compare` prints every entry that differs and exits 1 if any does; with --subset only the entries
AFTER has are compared (a partial snapshot, e.g. one board, against a whole one).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from generator.release.bundle import sha256_file  # noqa: E402

DEFAULT_MODEL = "kjv-tiny"
PROMPT_IDS = "1,5,9,14"


def model_paths(names: list[str], work: Path) -> dict[str, Path]:
    from models import make_checkpoint  # tests/models.py: the suite's checkpoints, at their seeds

    paths = {}
    for name in names:
        if name == DEFAULT_MODEL:
            paths[name] = REPO / "models" / DEFAULT_MODEL
        else:
            out = work / "models" / name
            if not (out / "config.json").is_file():
                make_checkpoint(name, out)
            paths[name] = out
    return paths


def routing(stats: dict) -> dict:
    """What the firmware says about routing (MoE models): every stats field naming experts."""
    return {k: v for k, v in sorted(stats.items()) if "expert" in k or "routing" in k}


def one_run(model: Path, quant: str, board: str, out: Path, steps: int) -> dict:
    cmd = [
        str(REPO / "colibri"),
        "run",
        "--json",
        "--board",
        board,
        "--model",
        str(model),
        "--quant",
        quant,
        "--ctx",
        "64",
        "--out",
        str(out),
        "--prompt-ids",
        PROMPT_IDS,
        "--steps",
        str(steps),
        "--ignore-eos",
        "--greedy",
    ]
    out.parent.mkdir(parents=True, exist_ok=True)  # --out's parent must exist (its own folder is made by the build)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [""])[-1]
        return {"exit": done.returncode, "error": last}
    result = json.loads(done.stdout)
    return {
        "exit": 0,
        "image_sha256": sha256_file(out / "generated" / "weights.img"),
        "tokens": result["tokens"],
        "logits_sha256": result["logits_sha256"],
        "routing": routing(result.get("stats") or {}),
    }


def snapshot(args) -> int:
    from models import ORACLE_CONFIGS

    names = args.models.split(",") if args.models else [DEFAULT_MODEL, *ORACLE_CONFIGS]
    work = args.work.resolve()
    paths = model_paths(names, work)
    entries = {}
    for name, path in paths.items():
        for quant in args.quants.split(","):
            for board in args.boards.split(","):
                key = f"{name} {quant} {board}"
                entries[key] = one_run(path, quant, board, work / "build" / board / f"{name}-{quant}", args.steps)
                state = "ok" if entries[key]["exit"] == 0 else f"exit {entries[key]['exit']}"
                print(f"bits_snapshot: {key}: {state}", file=sys.stderr, flush=True)
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    args.out.write_text(
        json.dumps(
            {"commit": commit, "prompt_ids": PROMPT_IDS, "steps": args.steps, "entries": entries},
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )
    return 0


def compare(args) -> int:
    before, after = (json.loads(p.read_text())["entries"] for p in (args.before, args.after))
    differ = 0
    keys = set(after) if args.subset else set(before) | set(after)
    for key in sorted(keys):
        if before.get(key) != after.get(key):
            differ += 1
            print(f"{key}:\n  before {json.dumps(before.get(key))[:300]}\n  after  {json.dumps(after.get(key))[:300]}")
    ok = sum(1 for k in keys if (before.get(k) or {}).get("exit") == 0)
    print(f"{len(keys)} entries compared ({ok} ran before), {len(after)} after: {differ} differ")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    snap = sub.add_parser("snapshot")
    snap.add_argument("out", type=Path)
    snap.add_argument("--work", type=Path, default=Path("/tmp/colibri-bits"))
    snap.add_argument("--boards", default="host,linux-aarch64,qemu-rv32")
    snap.add_argument("--quants", default="f32,q8_0,q4_0,q4_1")
    snap.add_argument("--models", default="")
    snap.add_argument("--steps", type=int, default=6)
    cmp = sub.add_parser("compare")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    cmp.add_argument("--subset", action="store_true", help="compare only the entries AFTER has")
    args = ap.parse_args(argv)
    return snapshot(args) if args.command == "snapshot" else compare(args)


if __name__ == "__main__":
    sys.exit(main())
