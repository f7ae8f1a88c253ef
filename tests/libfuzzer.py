"""libFuzzer harnesses as the fuzz tests build and run them: clang with the fuzzer and the
sanitizers, then a bounded run over a corpus and seeds that must find nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

SANITIZED = ["-std=c11", "-g", "-O1", "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=all"]


def build_fuzzer(out: Path, *args: object, flags: tuple[object, ...] = (), linked_plain: tuple[Path, ...] = ()) -> Path:
    """clang with SANITIZED, then flags and args (sources), linked into out. linked_plain: sources
    the harness links but never reaches (a kernel set's other roles), compiled with `flags` and no
    instrumentation: the sanitizers and the coverage would multiply their compile time for nothing."""
    clang = shutil.which("clang-14") or shutil.which("clang")
    assert clang, "clang is installed by ./colibri test (tests/apt-packages.txt)"
    objects = []
    for source in linked_plain:
        obj = out.parent / f"{out.name}-{source.parent.name}-{source.stem}.o"
        plain = [clang, "-std=c11", "-g", "-O1", *map(str, flags), "-c", str(source), "-o", str(obj)]
        done = subprocess.run(plain, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        objects.append(str(obj))
    command = [clang, *SANITIZED, *map(str, flags), *objects, *map(str, args), "-o", str(out)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return out


def run_fuzzer(
    fuzzer: Path,
    corpus: Path,
    seeds: Path,
    artifacts: Path,
    *options: str,
    malloc_limit_mb: int,
    timeout: int,
    asan_options: str | None = None,
) -> subprocess.CompletedProcess:
    """The fuzzer over corpus and seeds from seed 1, crashes written into artifacts; it must exit 0.
    libFuzzer's RSS limit is off: Linux carries the peak RSS over exec, so the fuzzer would inherit
    the test process's and stop at once; the per-allocation limit still catches a runaway one."""
    run = subprocess.run(
        [str(fuzzer), str(corpus), str(seeds), *options, "-seed=1", "-rss_limit_mb=0",
         f"-malloc_limit_mb={malloc_limit_mb}", f"-artifact_prefix={artifacts}/"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, ASAN_OPTIONS=asan_options) if asan_options else None,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return run
