"""Measure the generation step of a build: wall time, CPU time and memory of every process that
takes part (the SCons process, which generates in-process, and its quantizing workers).

    .venv/bin/python tools/measure_generation.py MODEL_DIR [--quant q8_0] [--jobs N] [--out DIR] [--board host]

Runs `scons ... OUT/generated/weights.img` (generation only, no compiling) from a fresh build
directory (OUT is removed first; default /tmp/colibri-measure), then the same command again (a
no-op). Prints one JSON object: seconds, CPU seconds, peak RSS of the largest single process
(exact: each process's VmHWM), the peak of the process tree's summed RSS (sampled every 20 ms),
and the no-op's seconds. Used for docs/performance.md, "Generation at real sizes".
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _status(pid: int) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM", "PPid"):
                    out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def _tree(root: int) -> list[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ppid = _status(int(entry)).get("PPid")
            if ppid is not None:
                parents[int(entry)] = ppid
    found, frontier = [root], [root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        found += kids
        frontier += kids
    return found


def run(cmd: list[str]) -> dict:
    start = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak_sum = 0
    hwm: dict[int, int] = {}
    while proc.poll() is None:
        total = 0
        for pid in _tree(proc.pid):
            s = _status(pid)
            total += s.get("VmRSS", 0)
            hwm[pid] = max(hwm.get(pid, 0), s.get("VmHWM", 0))
        peak_sum = max(peak_sum, total)
        time.sleep(0.02)
    log = proc.stdout.read()
    seconds = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"the build failed:\n{log}")
    return {"seconds": round(seconds, 2),
            "cpu_seconds": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2),
            # ru_maxrss of children: the largest single process's peak, exact
            "peak_rss_largest_process_mib": round(max(after.ru_maxrss, max(hwm.values(), default=0)) / 1024, 1),
            "peak_rss_all_processes_mib": round(peak_sum / 1024, 1),
            "log": [line for line in log.splitlines() if "quantiz" in line or "GEN" in line]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--quant", default="q8_0")
    ap.add_argument("--jobs", type=int)
    ap.add_argument("--board", default="host")
    ap.add_argument("--out", type=Path, default=Path("/tmp/colibri-measure"))
    args = ap.parse_args(argv)
    shutil.rmtree(args.out, ignore_errors=True)
    scons = Path(sys.executable).parent / "scons"
    cmd = [str(scons), "-Q", "-C", str(REPO), f"board={args.board}", f"model={args.model.resolve()}",
           f"quant={args.quant}", f"out={args.out.resolve()}", str(args.out.resolve() / "generated" / "weights.img")]
    if args.jobs:
        cmd.insert(-1, f"jobs={args.jobs}")
    first = run(cmd)
    noop = run(cmd)
    image = args.out / "generated" / "weights.img"
    print(json.dumps({"model": str(args.model), "quant": args.quant, "jobs": args.jobs,
                      "checkpoint_bytes": sum(p.stat().st_size for p in args.model.glob("*.safetensors")),
                      "image_bytes": image.stat().st_size, "generation": first,
                      "no_op": {k: noop[k] for k in ("seconds", "cpu_seconds", "log")},
                      "load_average": os.getloadavg()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
