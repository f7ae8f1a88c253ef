"""Measure the expert cache of a built Linux-board firmware over budgets, with and without prefetch.

    .venv/bin/python tools/cache_sweep.py BUILD_DIR --budgets 96M,128M,192M [--steps 128] [--repeat 3]
        [--threads 1] [--evict lfu,lru] [--prefetch on,off] [--cgroup NAME] [--copy] [--against OTHER_BUILD_DIR]

BUILD_DIR is a `./colibri build` directory (firmware + generated/weights.img + plan.json). Each run
decodes bench's sampled stream (a fixed 8-token prompt, then sampling at bench.SAMPLED's settings,
seed 0: the same tokens at every budget; greedy decoding loops, and its routing with it, which
overstated the hit rates of the sweep in docs/performance.md measured that way; no logits hashing)
and prints the median of --repeat runs:
expert slots, hit rate, prefetched hits, bytes read from storage per decoded token, time waiting on
reads per token, decode tok/s, and the storage bandwidth the firmware measured just before (O_DIRECT
or with the file dropped from the page cache): the bound reads set is bandwidth / bytes per token.
Budget 0 is the mapped image with no budget; --copy adds the whole image read into memory (the path
before mapping) for comparison. --cgroup NAME runs the firmware in that memory cgroup
(tools/in-memory-cgroup). Runs alternate between configurations, so a drift of the machine's speed
spreads over all of them. --against runs every configuration with OTHER_BUILD_DIR's firmware too (another
version of the firmware for the same model: it must take the same image), on BUILD_DIR's image, run by
run in turn with BUILD_DIR's own, and prints each pair's ratio of decode speeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from generator.bench import SAMPLED  # noqa: E402
from generator.compile.cache_plan import parse_size  # noqa: E402
from generator.device.process import run_process  # noqa: E402
from generator.device.session import CacheStats, RunRequest, Session, cache_stats, request_frame  # noqa: E402


def one_run(
    build: Path,
    firmware: Path,
    budget: int,
    prefetch: bool,
    copy: bool,
    eviction: str,
    steps: int,
    threads: int,
    cgroup: str | None,
    vocab: int,
) -> dict:
    prompt = [1] + [(7919 * (i + 1)) % vocab for i in range(7)]
    request = RunRequest(
        prompt,
        steps,
        SAMPLED,
        stop_at_eos=False,
        threads=threads,
        digests=False,
        memory_budget=budget,
        prefetch=prefetch,
        eviction=eviction,
        probe_storage_mib=256 if budget else None,
    )
    argv = [str(firmware), "--weights", str(build / "generated" / "weights.img"), *request.firmware_options()]
    if copy:
        argv.append("--copy-weights")
    if cgroup:
        argv = [str(REPO / "tools" / "in-memory-cgroup"), cgroup, *argv]
    result = run_process(argv, request_frame(request), Session(), timeout=3600)
    s = result.stats
    passes = int(s["decode"])
    c = cache_stats(result) or CacheStats(mapped=0)
    uses = c.expert_uses
    out = {
        "decode_tok_s": passes / (int(s["decode_us"]) / 1e6),
        "peak_rss": int(s.get("peak_rss", 0)),
        "slots": c.slots or 0,
        "hit_rate": (c.cache_hits or 0) / uses if uses else None,
        "prefetched_hits": (c.prefetch_hits or 0) / uses if uses else None,
        "read_mb_per_token": (c.read_bytes or 0) / passes / 1e6,
        "wait_ms_per_token": (c.read_wait_us or 0) / passes / 1e3,
        "read_ms_per_token": c.read_time_us / passes / 1e3 if c.read_time_us is not None else None,
        "reads_in_flight": c.reads_in_flight,
        "storage_gb_s": int(result.storage["read_bw"]) / 1e9 if result.storage else None,
    }
    return out


def pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.0f} %"


def budget_name(row: dict) -> str:
    """How a table row names its build's weight budget."""
    if row["copy"]:
        return "whole image read into RAM"
    return "none (mapped)" if not row["budget"] else f"{row['budget'] / 2**20:.0f} MiB"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("build", type=Path)
    p.add_argument("--budgets", default="0", help="comma-separated sizes (0: no budget)")
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cgroup")
    p.add_argument("--copy", action="store_true", help="also run with the whole image read into memory")
    p.add_argument("--evict", default="lfu,lru", help="eviction policies to compare (lfu, lru)")
    p.add_argument("--prefetch", default="on,off", help="prefetch settings to compare under a budget (on, off)")
    p.add_argument("--against", type=Path, help="another build directory whose firmware runs in turn on the same image")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    vocab = json.loads((args.build / "generated" / "plan.json").read_text())["spec"]["vocab_size"]
    configs = []
    for budget in (parse_size(b) for b in args.budgets.split(",")):
        if not budget:
            configs.append((0, True, False, "lfu"))
            continue
        for eviction in args.evict.split(","):
            configs += [(budget, setting == "on", False, eviction) for setting in args.prefetch.split(",")]
    if args.copy:
        configs.append((0, False, True, "lfu"))
    builds = [args.build] + ([args.against] if args.against else [])
    runs: dict = {(b, *c): [] for c in configs for b in builds}
    for _ in range(args.repeat):
        for c in configs:
            for b in builds:
                runs[(b, *c)].append(
                    one_run(args.build, b / "firmware", *c, args.steps, args.threads, args.cgroup, vocab)
                )
    rows = []
    for (build, budget, prefetch, copy, eviction), rs in runs.items():
        row = {"build": str(build), "budget": budget, "prefetch": prefetch, "copy": copy, "eviction": eviction}
        for key in rs[0]:
            values = [r[key] for r in rs if r[key] is not None]
            row[key] = statistics.median(values) if values else None
        row["decode_tok_s_runs"] = [round(r["decode_tok_s"], 2) for r in rs]
        if row["storage_gb_s"] and row["read_mb_per_token"]:
            row["storage_bound_tok_s"] = row["storage_gb_s"] * 1e3 / row["read_mb_per_token"]
        if args.against and build == args.build:
            # run by run: this build's decode speed over the other's in the run just after it
            other = runs[(args.against, budget, prefetch, copy, eviction)]
            row["ratio_runs"] = [round(a["decode_tok_s"] / o["decode_tok_s"], 2) for a, o in zip(rs, other)]
            row["ratio"] = statistics.median(row["ratio_runs"])
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if args.against:
        print(
            "| build | budget | eviction | prefetch | slots | hit rate | MB read/token | I/O wait ms/token | "
            "reads ms/token | decode tok/s (runs) | ratio to --against (runs) |"
        )
        print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            name = budget_name(r)
            reads = "—" if r["read_ms_per_token"] is None else f"{r['read_ms_per_token']:.1f}"
            ratio = "" if "ratio" not in r else f"{r['ratio']:.2f} ({', '.join(map(str, r['ratio_runs']))})"
            print(
                f"| {Path(r['build']).name} | {name} | {r['eviction'] if r['budget'] else '—'} | "
                f"{'on' if r['prefetch'] else 'off'} | {r['slots']:.0f} | {pct(r['hit_rate'])} | "
                f"{r['read_mb_per_token']:.1f} | {r['wait_ms_per_token']:.1f} | {reads} | "
                f"{r['decode_tok_s']:.1f} ({', '.join(map(str, r['decode_tok_s_runs']))}) | {ratio} |"
            )
        return 0
    print(
        "| budget | eviction | prefetch | slots | hit rate | of them prefetched | MB read/token | I/O wait ms/token | "
        "decode tok/s (runs) | storage GB/s | bound tok/s | of bound | peak RSS MiB |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        name = budget_name(r)
        bound = r.get("storage_bound_tok_s")
        storage = "—" if not r["storage_gb_s"] else f"{r['storage_gb_s']:.2f}"
        bound_text = "—" if not bound else f"{bound:.1f}"
        of_bound = "—" if not bound else f"{100 * r['decode_tok_s'] / bound:.0f} %"
        print(
            f"| {name} | {r['eviction'] if r['budget'] else '—'} | {'on' if r['prefetch'] else 'off'} "
            f"| {r['slots']:.0f} | {pct(r['hit_rate'])} | "
            f"{pct(r['prefetched_hits'])} | {r['read_mb_per_token']:.1f} | {r['wait_ms_per_token']:.1f} | "
            f"{r['decode_tok_s']:.1f} ({', '.join(map(str, r['decode_tok_s_runs']))}) | {storage} | {bound_text} | "
            f"{of_bound} | {r['peak_rss'] / 2**20:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
