"""Measure the generation step of a build: wall time, CPU time and memory of every process that
takes part (the SCons process, which generates in-process, and its quantizing workers), against
`cp` of the same input on the same disk in the same run.

    .venv/bin/python tools/measure_generation.py MODEL [--quant q8_0] [--jobs N] [--out DIR] [--board host]
        [--copy-to DIR] [--no-copy]

MODEL is a checkpoint directory or a .gguf file. First `cp MODEL-FILES DIR && sync` is timed (DIR
defaults to beside OUT, so on OUT's disk; the copy is removed at once), then
`scons ... OUT/generated/weights.img` (generation only, no compiling) from a fresh build directory
(OUT is removed first; default /tmp/colibri-measure), then `sync` (what the image still had in the
page cache reaching the disk), then the same scons command again (a no-op). Before the copy and
before the generation the input's pages are dropped from the page cache (posix_fadvise DONTNEED on
those files only), so neither run reads what the other left cached. Prints one JSON object:
seconds, CPU seconds, the generation action's own seconds (within the step, from SCons's
--debug=time), peak RSS of the largest single process (exact: each process's VmHWM), the peak of
the process tree's summed RSS (sampled every 20 ms), the sync after it, the copy's
seconds, the ratios generation / copy, and the no-op's seconds. Used for docs/performance.md,
"Generation at real sizes".
"""

from __future__ import annotations

import argparse
import json
import os
import re
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


def _children(pid: int) -> list[int]:
    kids = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return kids


def _tree(root: int) -> list[int]:
    """root and its descendants, from the kernel's children lists: a scan of every process in
    /proc would cost the measured build a tenth of a core on this machine."""
    found, frontier = [root], [root]
    while frontier:
        kids = _children(frontier.pop())
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
    return {
        "seconds": round(seconds, 2),
        "cpu_seconds": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2),
        # ru_maxrss of children: the largest single process's peak, exact
        "peak_rss_largest_process_mib": round(max(after.ru_maxrss, max(hwm.values(), default=0)) / 1024, 1),
        "peak_rss_all_processes_mib": round(peak_sum / 1024, 1),
        "generate_action_seconds": _action_seconds(log),
        "log": _log(log),
    }


def _action_seconds(text: str) -> float | None:
    """The generation action's own time (SCons's --debug=time "Command execution time"): the rest
    of the step is SCons starting, planning, and hashing what the action wrote."""
    found = re.search(r"^Command execution time: .*weights\.img: ([0-9.]+) seconds$", text, re.M)
    return round(float(found.group(1)), 2) if found else None


def _log(text: str) -> list[str]:
    """The build's lines about generation, of its progress lines only the last."""
    lines = [line for line in text.splitlines() if "quantiz" in line or "GEN" in line or "note:" in line]
    progress = [line for line in lines if " weights: " in line]
    return [line for line in lines if " weights: " not in line] + progress[-1:]


def input_files(model: Path) -> list[Path]:
    """The files a build reads the weights from: a GGUF file, or a checkpoint's safetensors shards."""
    return [model] if model.is_file() else sorted(model.glob("*.safetensors"))


def evict(paths: list[Path]) -> None:
    """Drop these files' clean pages from the page cache (other files' pages stay), so the next
    run reads them from the disk as a first build does."""
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed_sync() -> float:
    start = time.monotonic()
    os.sync()
    return round(time.monotonic() - start, 2)


def copy_seconds(files: list[Path], dest: Path) -> float:
    """`cp FILES DEST && sync`, timed; the copy is removed afterwards."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        start = time.monotonic()
        subprocess.run(["cp", *map(str, files), str(dest)], check=True)
        os.sync()
        return round(time.monotonic() - start, 2)
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--quant", default="q8_0")
    ap.add_argument("--jobs", type=int)
    ap.add_argument("--board", default="host")
    ap.add_argument("--out", type=Path, default=Path("/tmp/colibri-measure"))
    ap.add_argument("--copy-to", type=Path, help="a new folder the copy goes to (default: beside --out, on its disk)")
    ap.add_argument("--no-copy", action="store_true", help="measure the generation only")
    args = ap.parse_args(argv)
    files = input_files(args.model)
    if not files:
        sys.exit(f"measure_generation: {args.model} is neither a .gguf file nor a folder of safetensors shards")
    shutil.rmtree(args.out, ignore_errors=True)
    copy = None
    if not args.no_copy:
        evict(files)
        copy = copy_seconds(files, args.copy_to or args.out.resolve().parent / f".{args.out.name}-copy")
    scons = Path(sys.executable).parent / "scons"
    cmd = [
        str(scons),
        "-Q",
        "-C",
        str(REPO),
        "--debug=time",
        f"board={args.board}",
        f"model={args.model.resolve()}",
        f"quant={args.quant}",
        f"out={args.out.resolve()}",
        str(args.out.resolve() / "generated" / "weights.img"),
    ]
    if args.jobs:
        cmd.insert(-1, f"jobs={args.jobs}")
    evict(files)
    first = run(cmd)
    first["sync_after_seconds"] = timed_sync()
    noop = run(cmd)
    image = args.out / "generated" / "weights.img"
    result = {
        "model": str(args.model),
        "quant": args.quant,
        "jobs": args.jobs,
        "input_bytes": sum(p.stat().st_size for p in files),
        "image_bytes": image.stat().st_size,
        "generation": first,
        "cp_and_sync_seconds": copy,
    }
    if copy:
        result["ratio_generation_to_cp"] = round(first["seconds"] / copy, 2)
        result["ratio_generation_and_sync_to_cp"] = round((first["seconds"] + first["sync_after_seconds"]) / copy, 2)
    result.update({"no_op": {k: noop[k] for k in ("seconds", "cpu_seconds", "log")}, "load_average": os.getloadavg()})
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
