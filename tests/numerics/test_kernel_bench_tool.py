"""The kernel benchmarks in tools/ (docs/performance.md) build with the command their header gives:
kernel_bench.c measures the batched products at every count from one to sixteen tokens,
attention_bench.c a decode token's attention over a binary16 cache."""

import glob
import re
import shlex
import subprocess

from c_builds import objects_once
from conftest import REPO


def build_command(tool: str, out) -> list[str]:
    header = (REPO / "tools" / f"{tool}.c").read_text().split("*/")[0]
    lines = [line.strip(" *") for line in header.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("gcc "))
    command = " ".join(line.rstrip("\\").strip() for line in lines[start : start + 2])
    command = command.replace("$RT", str(REPO / "firmware_src" / "runtime")).replace(f"/tmp/{tool}", str(out))
    # a pattern (a kernel set's folder, kernels/<set>/[a-z]*.c) stands for its files, as in a shell
    return [path for arg in shlex.split(command) for path in sorted(glob.glob(arg, root_dir=REPO)) or [arg]]


def build(tool: str, out) -> None:
    """The header's command, each runtime source compiled once per test run (objects_once: the
    AVX2 set's objects are the numerics harness's and the other benchmark's), the tool's own
    source with them: the same compiler, flags, sources and libraries."""
    compiler, *arguments = build_command(tool, out)
    at = arguments.index("-o")
    assert arguments[at + 1] == str(out), arguments
    arguments[at : at + 2] = []
    flags = [a for a in arguments if a.startswith("-") and not a.startswith("-l")]
    libraries = [a for a in arguments if a.startswith("-l")]
    sources = [a for a in arguments if a.endswith(".c")]
    assert len(flags) + len(libraries) + len(sources) == len(arguments), arguments
    assert sources[0] == f"tools/{tool}.c", sources
    runtime = objects_once([compiler, *flags], sources[1:])
    subprocess.run([compiler, *flags, sources[0], *map(str, runtime), *libraries, "-o", str(out)], cwd=REPO, check=True)


def test_kernel_bench_builds_as_documented_and_times_one_to_sixteen_tokens(tmp_path):
    out = tmp_path / "kernel_bench"
    build("kernel_bench", out)
    for kind in ("q4_1", "q4_0", "q8_0"):
        done = subprocess.run([out, kind, "64", "128", "2"], capture_output=True, text=True, check=True)
        counts = [int(n) for n in re.findall(r"^(\d+) token\(s\): [\d.]+ ms", done.stdout, re.M)]
        assert counts == list(range(1, 17)), done.stdout
    refused = subprocess.run([out, "q4_1", "64", "100"], capture_output=True, text=True)
    assert refused.returncode == 2 and "multiple of 32" in refused.stderr


def test_attention_bench_builds_as_documented_and_times_the_three_steps(tmp_path):
    out = tmp_path / "attention_bench"
    build("attention_bench", out)
    for huge in ("0", "1"):
        done = subprocess.run([out, "40", "1", huge], capture_output=True, text=True, check=True)
        assert re.search(r"^40 positions, [\d.]+ MB of keys and values", done.stdout, re.M), done.stdout
        assert re.search(r"^a token: [\d.]+ ms; scores [\d.]+ ms .* value sums [\d.]+ ms", done.stdout, re.M)
    refused = subprocess.run([out, "0"], capture_output=True, text=True)
    assert refused.returncode == 2 and "positions > 0" in refused.stderr
