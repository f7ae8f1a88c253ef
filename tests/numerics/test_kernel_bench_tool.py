"""tools/kernel_bench.c, the batched products' cost per token count (docs/performance.md), builds
with the command its header gives and measures every count from one to sixteen tokens."""

import re
import shlex
import subprocess

from conftest import REPO


def build_command(out) -> list[str]:
    header = (REPO / "tools" / "kernel_bench.c").read_text().split("*/")[0]
    lines = [line.strip(" *") for line in header.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("gcc "))
    command = " ".join(line.rstrip("\\").strip() for line in lines[start : start + 2])
    command = command.replace("$RT", "firmware_src/runtime").replace("/tmp/kernel_bench", str(out))
    return shlex.split(command)


def test_kernel_bench_builds_as_documented_and_times_one_to_sixteen_tokens(tmp_path):
    out = tmp_path / "kernel_bench"
    subprocess.run(build_command(out), cwd=REPO, check=True)
    for kind in ("q4_1", "q4_0", "q8_0"):
        done = subprocess.run([out, kind, "64", "128", "2"], capture_output=True, text=True, check=True)
        counts = [int(n) for n in re.findall(r"^(\d+) token\(s\): [\d.]+ ms", done.stdout, re.M)]
        assert counts == list(range(1, 17)), done.stdout
    refused = subprocess.run([out, "q4_1", "64", "100"], capture_output=True, text=True)
    assert refused.returncode == 2 and "multiple of 32" in refused.stderr
