"""Every test model family over several MPI ranks: `verify` on `host-mpi` with `--hosts
localhost:N`, greedy and sampled, each run's tokens and per-step logits SHA-256 against the NumPy
reference (the single board's bits), and which of its layers the ranks split by KV group.

    .venv/bin/python tools/ranks_families.py [--ranks 2,4] [--models llama_gqa_linear,...]
        [--steps 12] [--work DIR]

The models are tests/models.py's oracle checkpoints at their seeds (made once into --work); the
suite runs the dense, MoE and hybrid ones on ranks (tests/device/test_mpi_ranks.py), this tool all
of them (docs/several-boards.md holds its table). Prints a Markdown table; exits 1 if any run
does not pass.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

PROMPT_IDS = "1,17,42,99,7"
SAMPLED = ["--temperature", "0.9", "--top-k", "40", "--top-p", "0.95", "--seed", "5"]


def verify(model: Path, ranks: int, steps: int, out: Path, sampling: list[str]) -> tuple[bool, str]:
    """One verify over `ranks` ranks here: (passed, its last line when it did not)."""
    cmd = [str(REPO / "colibri"), "verify", "--board", "host-mpi", "--hosts", f"localhost:{ranks}",
           "--model", str(model), "--ctx", "64", "--prompt-ids", PROMPT_IDS, "--steps", str(steps),
           "--out", str(out), "--json", *(sampling or ["--greedy"])]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode == 0 and json.loads(done.stdout).get("pass"):
        return True, ""
    lines = (done.stderr or done.stdout).strip().splitlines()
    return False, lines[-1] if lines else f"exit status {done.returncode}"


def split_layers(out: Path) -> str:
    """The layers whose attention the ranks split by KV group, as the build's plan says."""
    plan = json.loads((out / "generated" / "plan.json").read_text())
    layers = plan["kv_cache"].get("split_by_kv_group", [])
    return f"{len(layers)} of {plan['spec']['n_layers']}"


def main(argv: list[str]) -> int:
    from models import ORACLE_CONFIGS, make_checkpoint  # tests/models.py

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--models", default=",".join(sorted(ORACLE_CONFIGS)))
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "colibri-ranks-families")
    args = p.parse_args(argv)
    unknown = sorted(set(args.models.split(",")) - set(ORACLE_CONFIGS))
    if unknown:
        p.error(f"not a test model: {', '.join(unknown)}")
    print("| model | ranks | layers split by KV group | greedy | sampled |")
    print("|---|---|---|---|---|")
    failed = 0
    (args.work / "builds").mkdir(parents=True, exist_ok=True)  # verify's --out must have its parent
    for name in args.models.split(","):
        model = args.work / "models" / name
        if not (model / "config.json").is_file():
            make_checkpoint(name, model)
        for ranks in (int(n) for n in args.ranks.split(",")):
            out = args.work / "builds" / f"{name}-ranks{ranks}"
            results = [verify(model, ranks, args.steps, out, sampling) for sampling in ([], SAMPLED)]
            failed += sum(not ok for ok, _ in results)
            cells = ["PASS" if ok else f"FAIL: {why}" for ok, why in results]
            layers = split_layers(out) if (out / "generated" / "plan.json").is_file() else "(no build)"
            print(f"| {name} | {ranks} | {layers} | {' | '.join(cells)} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
