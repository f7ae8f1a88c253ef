"""Shared fixtures: tiny checkpoints, builds into temporary directories, firmware runs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

TESTS = Path(__file__).resolve().parent  # this folder: the shared helpers, data and C harnesses
REPO = TESTS.parent

# Parallel workers (pytest-xdist, as `./colibri test` runs the suite) each build the commands'
# default builds into their own build directory, set before the generator is imported: two
# workers building build/host/kjv-tiny-q8_0-ctx128 at once would overwrite each other's files.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["COLIBRI_BUILD_DIR"] = str(
        Path(tempfile.gettempdir()) / f"colibri-test-build-{os.environ['PYTEST_XDIST_WORKER']}"
    )

# One build cache for the whole run (generator/compile/build_cache.py), made by the first process,
# whose environment the parallel workers inherit: a firmware the run compiled once is taken from it
# by every later build in any worker or directory, and nothing comes from a developer's own cache.
# Removed when that first process ends.
# The test programs built from C (harnesses, fuzzers: tests/c_builds.py built_once) are shared the
# same way, in a folder of their own.
# The suite starts thousands of Python processes (each CLI run, each SCons build): they keep the
# generator's bytecode in a folder of the run's own, even where the environment says to write none
# (PYTHONDONTWRITEBYTECODE: each process then compiled every module it imports from source, 0.3 s
# of a CLI process's 0.8 s start), and none lands in the checkout.
_RUN_FOLDERS = []
if not os.environ.get("PYTEST_XDIST_WORKER"):
    _RUN_FOLDERS = [
        tempfile.mkdtemp(prefix="colibri-test-cache-"),
        tempfile.mkdtemp(prefix="colibri-test-programs-"),
        tempfile.mkdtemp(prefix="colibri-test-bytecode-"),
    ]
    os.environ["COLIBRI_CACHE_DIR"], os.environ["COLIBRI_TEST_PROGRAMS"], os.environ["PYTHONPYCACHEPREFIX"] = (
        _RUN_FOLDERS
    )
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.pycache_prefix, sys.dont_write_bytecode = os.environ["PYTHONPYCACHEPREFIX"], False

# A suite started as a background job of a non-interactive shell (`bash -c '... &'`, as CI
# machines start it) inherits SIGINT ignored, and Python keeps it so: the tests that send a CLI
# Ctrl-C then reached a deaf process, and ctrl_c_as_it_was blamed whichever test each worker ran
# first. Every process of the run starts with Python's own handler instead.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

sys.path.insert(0, str(REPO))
sys.path.insert(0, str(TESTS))

from c_builds import STRICT_C_FLAGS, built_once, objects_once  # noqa: E402

from generator.boards import kernel_set_sources, load_board  # noqa: E402
from generator.compile.build import prepare, run_scons  # noqa: E402
from generator.device.runner import run_on_board  # noqa: E402
from generator.device.session import RunRequest  # noqa: E402
from generator.numerics.sampling import SamplingParams  # noqa: E402

DEFAULT_MODEL = REPO / "models" / "kjv-tiny"

# Each test's wall and CPU time, and the files that took the most at the end of every run.
pytest_plugins = ["suite_times"]

# A developer's own board settings must not send the suite's runs over SSH: no default remote, no
# user config (test_remote.py sets what it needs, per test).
for _name in ("COLIBRI_REMOTE", "COLIBRI_REMOTE_CACHE", "COLIBRI_REMOTE_PREFIX", "COLIBRI_SSH_COMMAND"):
    os.environ.pop(_name, None)
os.environ["COLIBRI_CONFIG"] = os.devnull


def pytest_addoption(parser):
    parser.addoption(
        "--fast",
        action="store_true",
        help="the fast tier: leave out the tests marked slow (emulated boards, real model files, releases)",
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slow: left out of the fast tier (./colibri test --fast): seconds or more each, measured in a full run",
    )


def pytest_unconfigure(config):
    for folder in _RUN_FOLDERS:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    if config.getoption("--fast"):
        slow = [item for item in items if item.get_closest_marker("slow")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if not item.get_closest_marker("slow")]
    from suite_times import file_order  # (loaded by pytest_plugins, with its asserts rewritten)

    items[:] = file_order(config, items)


@pytest.fixture(autouse=True)
def ctrl_c_as_it_was(request):
    """Each test leaves Ctrl-C as it found it: Python's handler for SIGINT and SIGINT not blocked.
    A child inherits an ignored or blocked signal through exec, so a test that left either behind
    made a later test's CLI deaf to the Ctrl-C it was sent, in whichever test shared its worker
    (seen only in full runs). Put back here, and named in the run's warnings, so the test that
    leaves it is found."""
    yield
    handler = signal.getsignal(signal.SIGINT)
    blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    if handler is not signal.default_int_handler or blocked:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        warnings.warn(f"{request.node.nodeid} left SIGINT {'blocked' if blocked else 'handled by ' + repr(handler)}")


class Builder:
    """Builds (model, quant, ctx, board, KV type) once per test session. kv_type None: the board's
    (f16), except with f32 weights, which keep an f32 cache: the tests hold those to transformers
    with float32's tolerance."""

    def __init__(self, root: Path):
        self.root = root
        self.cache = {}

    def build(self, model_dir: Path, quant: str = "q8_0", ctx: int = 64, board: str = "host", kv_type=None, ranks=1):
        kv_type = kv_type or ("f32" if quant == "f32" else None)
        key = (str(model_dir), quant, ctx, board, kv_type, ranks)
        if key not in self.cache:
            b = load_board(board)
            split = f"-ranks{ranks}" if ranks > 1 else ""
            out = self.root / f"{Path(model_dir).name}-{quant}-{ctx}-{board}-kv{kv_type or b.kv_type}{split}"
            req, plan = prepare(b, model_dir, quant, ctx, out, kv_type=kv_type, ranks=ranks)
            self.cache[key] = (b, run_scons(req), plan)
        return self.cache[key]

    def run(
        self,
        model_dir: Path,
        prompt,
        steps,
        quant="q8_0",
        ctx=64,
        sampling=SamplingParams(),
        stop_at_eos=False,
        logits_out=None,
        board="host",
        kv_type=None,
    ):
        board, art, plan = self.build(model_dir, quant, ctx, board, kv_type)
        request = RunRequest(list(prompt), steps, sampling, stop_at_eos)
        result = run_on_board(
            board,
            art.program,
            art.weights,
            request,
            art.model_hash(),
            logits_out=logits_out,
            flash_image=art.flash_image,
        )
        return art, plan, request, result


@pytest.fixture(scope="session")
def builder(tmp_path_factory) -> Builder:
    return Builder(tmp_path_factory.mktemp("builds"))


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """kind -> model directory, made on first use."""
    from models import make_checkpoint

    root = tmp_path_factory.mktemp("checkpoints")
    made = {}

    def get(kind: str, **kwargs) -> Path:
        key = (kind, tuple(sorted(kwargs.items())))
        if key not in made:
            name = kind + "".join(f"-{k}{v}" for k, v in sorted(kwargs.items()))
            made[key] = make_checkpoint(kind, root / name, **kwargs)
        return made[key]

    return get


@pytest.fixture(scope="session")
def gpt_oss_peer(tmp_path_factory):
    """The random-init gpt-oss checkpoint (vocab 512: kjv-tiny's tokenizer, which the converter
    needs) and {outtype: .gguf} as llama.cpp's own convert_hf_to_gguf.py writes it, f32 and q8_0."""
    from gguf_files import peer_convert

    from models import ORACLE_CONFIGS, make_checkpoint

    config_cls, model_cls, kwargs = ORACLE_CONFIGS["gpt_oss"]
    root = tmp_path_factory.mktemp("gpt-oss-peer")
    model_dir = make_checkpoint((config_cls, model_cls, dict(kwargs, vocab_size=512)), root / "model")
    return model_dir, {t: peer_convert(model_dir, root / f"gpt-oss-{t}.gguf", t) for t in ("f32", "q8_0")}


# Kernel sets to check against NumPy: (name, compiler, extra flags, how to run it).
HARNESS_BUILDS = {
    "generic": ("gcc", [], []),
    "x86_avx2": ("gcc", [], []),
    "x86_avx2-novnni": ("gcc", ["-DKERNEL_NO_VNNI"], []),  # the AVX2 path on a CPU with AVX-VNNI too
    "rv32": ("gcc", [], []),  # portable C: checked here, run for real on qemu-rv32
    # aarch64 under qemu-aarch64: a CPU with the dot-product extension and one without.
    "arm_neon-dotprod": ("aarch64-linux-gnu-gcc", ["-static"], ["qemu-aarch64", "-cpu", "max"]),
    "arm_neon-plain": ("aarch64-linux-gnu-gcc", ["-static"], ["qemu-aarch64", "-cpu", "cortex-a72"]),
}


# The fast tier checks the kernel sets this machine runs natively; the rest are slow.
FAST_HARNESS_BUILDS = ("generic", "x86_avx2")


@pytest.fixture(
    scope="session",
    params=[
        pytest.param(name, marks=() if name in FAST_HARNESS_BUILDS else pytest.mark.slow)
        for name in sorted(HARNESS_BUILDS)
    ],
)
def harness(request) -> list[str]:
    """tests/c/numerics_harness.c built against the runtime's ops, sampler and each kernel set:
    the scalar kernels (generic.c), AVX2 (kernels/x86_avx2/), the rv32 set (kernels/rv32/, portable C) and NEON
    (kernels/arm_neon/, with and without SDOT, under qemu-aarch64), once per run for all workers.
    Returns the command that runs it."""
    cc, flags, runner = HARNESS_BUILDS[request.param]
    kernel = request.param.split("-")[0]
    rt = REPO / "firmware_src" / "runtime"
    sources = [
        REPO / "tests" / "c" / "numerics_harness.c",
        rt / "ops.c",
        rt / "sampler.c",
        *kernel_set_sources("scalar"),
        *kernel_set_sources(kernel),
    ]
    objects = objects_once([cc, *STRICT_C_FLAGS, *flags, f"-I{rt}"], sources)
    return [*runner, str(built_once(f"harness-{request.param}", [cc, *flags, *map(str, objects), "-lm"]))]


def run_harness(harness: list[str], args: list, payload: bytes) -> bytes:
    done = subprocess.run([*harness, *map(str, args)], input=payload, capture_output=True, check=True)
    return done.stdout


def f32_bytes(*arrays) -> bytes:
    return b"".join(np.ascontiguousarray(a, dtype="<f4").tobytes() for a in arrays)


def half_bytes(*arrays) -> bytes:
    """Weight block scales and minimums as the image and the kernels hold them: binary16. The
    arrays must hold binary16 values already (a float32 that binary16 cannot hold is an error)."""
    out = []
    for a in arrays:
        h = np.asarray(a).astype("<f2")
        assert np.array_equal(h.astype(np.float32), np.asarray(a).astype(np.float32)), "not binary16 values"
        out.append(h.tobytes())
    return b"".join(out)


def run_rv32_semihosted(sources: list, elf: Path, include: Path, timeout: int = 300, extra: tuple = ()) -> str:
    """C sources built with the qemu-rv32 board's compiler and flags, with picolibc's semihosting
    for their output instead of the board's startup and UART, run bare metal on
    qemu-system-riscv32 with exact instruction counting (-icount shift=0). Returns what they printed
    (qemu writes the semihosting console to stderr); the program's exit through the SiFive test
    device must be 0."""
    board = load_board("qemu-rv32")
    link = [
        f"-Wl,--defsym={k}={v}"
        for k, v in (
            ("__flash", "0x80000000"),
            ("__flash_size", "0x400000"),
            ("__ram", "0x80400000"),
            ("__ram_size", "0x400000"),
        )
    ]
    subprocess.run(
        [
            board.cc,
            *board.cflags,
            "--oslib=semihost",
            f"-I{include}",
            *link,
            *map(str, sources),
            *extra,
            "-o",
            str(elf),
        ],
        check=True,
    )
    qemu = ["qemu-system-riscv32", "-M", "virt", "-cpu", "rv32", "-bios", "none", "-display", "none"]
    qemu += [
        "-monitor",
        "none",
        "-serial",
        "none",
        "-icount",
        "shift=0",
        "-semihosting-config",
        "enable=on,target=native",
    ]
    done = subprocess.run(
        [*qemu, "-kernel", str(elf)], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


def run_cli(*args, cwd=REPO, timeout=600):
    """Run the CLI in a subprocess, as a user would (python -m generator.cli)."""
    return subprocess.run(
        [sys.executable, "-m", "generator.cli", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ---- one signed host release for the tests that check and tamper with releases (tests/release/) ----


@pytest.fixture(scope="session")
def release_keys(tmp_path_factory) -> Path:
    """release.key/.pub and other.key/.pub: two ed25519 key pairs."""
    from generator.release.signing import generate_signing_key

    root = tmp_path_factory.mktemp("keys")
    generate_signing_key(root / "release.key", root / "release.pub")
    generate_signing_key(root / "other.key", root / "other.pub")
    return root


@dataclass(frozen=True)
class MadeRelease:
    """A release as `./colibri release --json` made it: its files and the command's document."""

    bundle: Path
    tarball: Path
    measurements_file: Path
    summary: dict


@pytest.fixture(scope="session")
def signed_host_release(tmp_path_factory, release_keys) -> MadeRelease:
    """A host release of the default model, signed with release.key, made once by the command as a
    user runs it (about 50 s: a release compiles from source) for every test that checks or tampers
    with a bundle (each tampers with its own copy_release)."""
    out = tmp_path_factory.mktemp("release") / "out"
    done = run_cli(
        "release", "--board", "host", "--model", DEFAULT_MODEL, "--quant", "q8_0", "--ctx", "64", "--out", out,
        "--sign", release_keys / "release.key", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    return MadeRelease(Path(summary["bundle"]), Path(summary["tarball"]), Path(summary["measurements"]), summary)


def copy_release(release, dest: Path) -> Path:
    """A copy of the bundle and its tarball, to tamper with."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(release.bundle, dest / release.bundle.name)
    shutil.copyfile(release.tarball, dest / release.tarball.name)
    return dest / release.bundle.name


def resign_sums(bundle: Path) -> None:
    """What a careless (or malicious) editor does after changing a file: make SHA256SUMS agree."""
    from generator.release.bundle import write_sums

    write_sums(bundle)
    tarball = bundle.parent / f"{bundle.name}.tar.gz"
    tarball.unlink(missing_ok=True)
