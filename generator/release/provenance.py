"""Where a release comes from: the model's files and hashes, the sources (git commit, or their
SHA-256), the toolchain versions, SOURCE_DATE_EPOCH, and the verification request it records.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

from .. import __version__
from ..boards import Board, board_files
from ..device.session import RunRequest
from ..errors import ColibriError
from ..files import REPO, slug
from ..model.load import companion_files, generation_config, load_model
from ..numerics.sampling import SamplingParams, generation_defaults
from .bundle import is_plain_name, sha256_file

# The verification decode every release records: greedy, a fixed tokenizer-free prompt (the
# model's BOS token, then ids spread over the vocabulary, as `bench` uses), a fixed step count.
DEFAULT_STEPS = 32


DEFAULT_PROMPT_TOKENS = 8


# What the firmware is made from, besides the model and the board file (hashed into the manifest).
SOURCE_PATHS = ("SConstruct", "site_scons", "generator", "templates", "firmware_src")


# Python packages whose version can change the bytes of a release.
BUILD_PACKAGES = ("numpy", "jinja2", "scons", "pyelftools", "esptool")


def _tool_env() -> dict[str, str]:
    """Environment for asking tools their version: untranslated, whatever the caller's locale."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C", "TZ": "UTC"}


def _first_line(argv: list[str]) -> str:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, env=_tool_env(), timeout=30, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unavailable"
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else "unavailable"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(REPO), *args],
            capture_output=True,
            text=True,
            env=_tool_env(),
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _source_files(board: Board) -> list[Path]:
    files = []
    for name in SOURCE_PATHS:
        path = REPO / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += [p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    files += board_files(board)
    return sorted(set(files))


def source_info(board: Board) -> dict:
    """Generator version, git commit (or "unknown" outside a git checkout), whether the build's
    sources differ from that commit, and one SHA-256 over every source the firmware is made from."""
    digest = hashlib.sha256()
    for path in _source_files(board):
        rel = path.relative_to(REPO).as_posix()
        digest.update(f"{sha256_file(path)}  {rel}\n".encode())
    commit, dirty = "unknown", None
    top = _git("rev-parse", "--show-toplevel")
    if top and Path(top).resolve() == REPO.resolve():
        commit = _git("rev-parse", "HEAD") or "unknown"
        if commit != "unknown":
            paths = [*SOURCE_PATHS, *(p.relative_to(REPO).as_posix() for p in board_files(board))]
            status = _git("status", "--porcelain", "--untracked-files=normal", "--", *paths)
            dirty = bool(status) if status is not None else None
    return {"version": __version__, "git_commit": commit, "git_dirty": dirty, "source_sha256": digest.hexdigest()}


def default_source_date_epoch() -> int:
    """SOURCE_DATE_EPOCH from the environment, else the git commit's time, else 0."""
    env = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if env:
        if not env.isdigit():
            raise ColibriError(f"SOURCE_DATE_EPOCH must be a non-negative integer, got {env!r}")
        return int(env)
    top = _git("rev-parse", "--show-toplevel")
    if top and Path(top).resolve() == REPO.resolve():
        when = _git("log", "-1", "--format=%ct")
        if when and when.isdigit():
            return int(when)
    return 0


def toolchain_info(board: Board) -> dict:
    info = {
        "cc": board.cc,
        "cc_version": _first_line([board.cc, "--version"]),
        "python": platform.python_version(),
        "packages": {},
    }
    ld = _first_line([board.cc, "-print-prog-name=ld"])
    info["ld_version"] = _first_line([ld, "--version"]) if ld != "unavailable" else ld
    for name in BUILD_PACKAGES:
        if name == "esptool" and not board.is_flashed:
            continue
        try:
            info["packages"][name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info["packages"][name] = "not installed"
    emulator = board.runner.emulated_by()
    if emulator is not None:
        info["emulator"] = _first_line([emulator, "--version"])
    return info


def model_files(model_dir: Path) -> list[str]:
    """Names of the model's files a release depends on (the build's inputs, then the tokenizer)."""
    checkpoint = load_model(model_dir, load_tensors=False)
    names = {Path(p).name for p in checkpoint.input_files}
    names |= {p.name for p in companion_files(model_dir)}
    return sorted(names)


def stage_model(
    model_dir: Path, names: list[str], dest: Path, name: str | None = None, expected: dict[str, dict] | None = None
) -> tuple[Path, dict[str, dict]]:
    """Hard-link (or copy) exactly `names` into dest/<name>/ (by default the model directory's own
    name, which is the model's name in the generated sources), hashing them; with `expected`, every
    file must have the recorded SHA-256. The build then sees only the release's files."""
    staged = dest / (name or model_dir.resolve().name)
    if staged.parent != dest or not all(is_plain_name(n) for n in [staged.name, *names]):
        raise ColibriError(f"the model's name {staged.name!r} or a file name of it is not a plain name")
    staged.mkdir(parents=True)
    hashes = {}
    for name in names:
        src = model_dir / name
        if not src.is_file():
            raise ColibriError(f"{model_dir}: the release's model file {name} is missing")
        target = staged / name
        try:
            os.link(src, target)
        except OSError:
            shutil.copyfile(src, target)
        hashes[name] = {"sha256": sha256_file(target), "size": target.stat().st_size}
        if expected is not None and hashes[name]["sha256"] != expected[name]["sha256"]:
            raise ColibriError(
                f"{model_dir / name} is not the file the release was made from (SHA-256 "
                f"{hashes[name]['sha256'][:16]}…, the manifest says "
                f"{expected[name]['sha256'][:16]}…)"
            )
    return staged, hashes


def sampling_defaults(model_dir: Path, spec) -> dict:
    """generation_config.json's sampling settings, as `run` and `verify` apply them by default."""
    gen = generation_config(model_dir)[0]
    d = generation_defaults(model_dir)
    return {
        "do_sample": gen.get("do_sample") is True,
        "temperature": d.temperature,
        "top_k": d.top_k,
        "top_p": d.top_p,
        "min_p": d.min_p,
        "eos_token_ids": list(spec.eos_token_ids),
    }


def default_request(spec, n_ctx: int) -> RunRequest:
    start = spec.bos_token_id if spec.bos_token_id is not None else 1
    n_prompt = max(1, min(DEFAULT_PROMPT_TOKENS, n_ctx // 4))
    prompt = [start % spec.vocab_size] + [(7919 * (i + 1)) % spec.vocab_size for i in range(n_prompt - 1)]
    steps = max(1, min(DEFAULT_STEPS, n_ctx - n_prompt + 1))
    return RunRequest(prompt, steps, SamplingParams(), stop_at_eos=False)


def request_dict(request: RunRequest) -> dict:
    return {
        "prompt": list(request.prompt),
        "steps": request.steps,
        "sampling": asdict(request.sampling),
        "stop_at_eos": request.stop_at_eos,
    }


def _is_int(value: object, low: int = 0, high: int = 1 << 64) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < high


def _is_fraction(value: object, high: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= high


def request_from(data: object) -> RunRequest:
    """The decode request a manifest records (inputs.verification), each value of its type and range."""
    malformed = ColibriError("manifest.json: malformed inputs.verification (the release's decode request)")
    if not isinstance(data, dict) or not isinstance(data.get("sampling"), dict):
        raise malformed
    try:
        prompt, steps, stop_at_eos = data["prompt"], data["steps"], data["stop_at_eos"]
        sampling = SamplingParams(**data["sampling"])
    except (KeyError, TypeError):
        raise malformed from None
    if not (
        isinstance(prompt, list)
        and all(_is_int(t, high=1 << 31) for t in prompt)
        and _is_int(steps, 1, 1 << 31)
        and isinstance(stop_at_eos, bool)
        and _is_int(sampling.top_k, high=1 << 31)
        and _is_int(sampling.seed)
        and _is_fraction(sampling.temperature, 1e6)
        and _is_fraction(sampling.top_p, 1.0)
        and _is_fraction(sampling.min_p, 1.0)
    ):
        raise malformed
    return RunRequest(list(prompt), steps, sampling, stop_at_eos)


def bundle_name(model_name: str, board: str, quant: str, n_ctx: int, ranks: int = 1) -> str:
    """The bundle's name; a build for several MPI ranks says how many (as its build directory does)."""
    return f"colibri-{slug(model_name)}-{board}-{quant}-ctx{n_ctx}" + (f"-ranks{ranks}" if ranks > 1 else "")


def version_report() -> list[str]:
    """`./colibri --version`: the generator, the git commit it runs from, and every board's
    toolchain as found on this machine (what a release would record)."""
    from ..boards import available_boards, load_board
    from ..compile.esp32.idf_build import find_idf

    commit = "not a git checkout"
    top = _git("rev-parse", "--show-toplevel")
    if top and Path(top).resolve() == REPO.resolve():
        head = _git("rev-parse", "HEAD")
        if head:
            status = _git("status", "--porcelain", "--untracked-files=no", "--", *SOURCE_PATHS)
            commit = head + (" with uncommitted changes" if status else "")
    lines = [
        f"colibri {__version__} (git {commit})",
        f"python {platform.python_version()}, "
        + ", ".join(f"{name} {_package_version(name)}" for name in BUILD_PACKAGES),
    ]
    tools: dict[str, list[str]] = {}
    for name in available_boards():
        try:
            board = load_board(name)
        except ColibriError:
            continue
        for tool in dict.fromkeys([board.cc, *board.runner.emulators()]):
            tools.setdefault(tool, []).append(name)
        if board.is_esp_idf:
            tools.setdefault("idf.py", []).append(name)
    lines.append("toolchains:")
    for tool, boards in tools.items():
        if tool == "idf.py":
            idf = find_idf()
            found = _first_line([str(idf), "--version"]) if idf else "not found"
        elif shutil.which(tool):
            found = _first_line([tool, "--version"])
        else:
            found = "not found"
        lines.append(f"  {tool:<24} {found}  [{', '.join(boards)}]")
    return lines


def _package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"
