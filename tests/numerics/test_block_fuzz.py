"""libFuzzer over every kept GGUF block type's C decoders (tests/c/fuzz_blocks.c): each type's
kernel_<type>_unpack on every 32-value group and its matvec, the scalar reference's and the AVX2
set's, under ASan and UBSan, for a fixed number of runs in every test run; where the blocks are ones
a weight image can hold (every binary16 field and value finite) the two matvecs give the same bits.
The seeds include subnormal scales (binary16 0x0001, MXFP4 exponents 0 and 1), which are legal and
must decode like any other."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import REPO
from libfuzzer import build_fuzzer, run_fuzzer

from generator.boards import kernel_set_sources

RUNTIME = REPO / "firmware_src" / "runtime"
C_TESTS = REPO / "tests" / "c"
# (name, values per block, bytes per block, binary16 field offsets), in fuzz_blocks.c's TYPES order.
TYPES = [
    ("Q5_0", 32, 22, (0,)),
    ("Q5_1", 32, 24, (0, 2)),
    ("Q4_K", 256, 144, (0, 2)),
    ("Q5_K", 256, 176, (0, 2)),
    ("Q6_K", 256, 210, (208,)),
    ("Q3_K", 256, 110, (108,)),
    ("Q2_K", 256, 84, (80, 82)),
    ("IQ4_NL", 32, 18, (0,)),
    ("IQ4_XS", 256, 136, (0,)),
    ("MXFP4", 32, 17, ()),
]
RUNS = 50_000

pytestmark = pytest.mark.slow  # the ASan + UBSan build of the block code takes most of a minute of CPU


def seeds(into) -> None:
    """Two rows of two blocks of each type: random bytes with a finite scale, the same with a
    subnormal scale (and MXFP4's exponents 0 and 1), and one with a NaN scale."""
    rng = np.random.default_rng(0)
    into.mkdir()
    for index, (name, _, size, halves) in enumerate(TYPES):
        variants = {"finite": np.float16(0.01), "subnormal": np.uint16(1).view(np.float16), "nan": np.float16(np.nan)}
        for label, scale in variants.items():
            blocks = bytearray(rng.integers(0, 256, 4 * size, dtype=np.uint8).tobytes())
            for k in range(4):
                for offset in halves:
                    blocks[k * size + offset : k * size + offset + 2] = np.array([scale]).tobytes()
                if name == "MXFP4":
                    blocks[k * size] = {"finite": 120, "subnormal": k % 2, "nan": 0xFF}[label]
            (into / f"{name}-{label}").write_bytes(bytes([index, 1, len(label)]) + bytes(blocks))


# The AVX2 set's files the harness reaches: the block decoders and matvecs (blocks.c), the set's
# entry points (set.c) and its CPU check (cpu.c). Its other roles are linked uninstrumented.
FUZZED_AVX2 = ("blocks.c", "set.c", "cpu.c")


def test_libfuzzer_finds_no_block_the_decoders_mishandle(tmp_path):
    """About a minute in CI, nearly all of it the build: clang with ASan and UBSan over the scalar
    set and the AVX2 set's block code, then 50,000 runs through both sets' decoders and matvecs
    (about 7 s)."""
    avx2 = kernel_set_sources("x86_avx2")
    flags = ("-ffp-contract=off", "-fno-math-errno", "-include", C_TESTS / "fuzz_cpu_features.h", f"-I{RUNTIME}")
    fuzzer = build_fuzzer(
        tmp_path / "fuzz_blocks",
        C_TESTS / "fuzz_blocks.c",
        RUNTIME / "ops.c",
        *kernel_set_sources("scalar"),
        *[source for source in avx2 if source.name in FUZZED_AVX2],
        "-lm",
        flags=flags,
        linked_plain=tuple(source for source in avx2 if source.name not in FUZZED_AVX2),
    )
    assert all(any(source.name == name for source in avx2) for name in FUZZED_AVX2)  # the roles still exist
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    seeds(tmp_path / "seeds")
    run = run_fuzzer(
        fuzzer, corpus, tmp_path / "seeds", tmp_path, f"-runs={RUNS}", "-max_len=4096",
        malloc_limit_mb=64, timeout=300, asan_options="quarantine_size_mb=16",
    )  # fmt: skip
    assert f"Done {RUNS} runs" in run.stderr and not list(tmp_path.glob("crash-*"))
