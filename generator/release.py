"""Release stage: a reproducible, verifiable firmware bundle for one (board, model, quant, ctx).

    make_release()    build in a private directory, verify the firmware against the NumPy
                      reference (boards that run here), assemble the bundle, sum it, tar it
    verify_release()  check every hash (and the ed25519 signature), rebuild from the manifest in a
                      fresh directory and compare byte for byte, naming each file that differs

Layout of `make_release(..., out_dir=OUT)` (docs/releases.md):

    OUT/<name>/                     the bundle (name: colibri-<model>-<board>-<quant>-ctx<N>)
        manifest.json               inputs, generator, toolchain, flags, SOURCE_DATE_EPOCH, outputs
        manifest.json.sig           ed25519 signature of manifest.json (64 raw bytes), when signed
        SHA256SUMS                  every other file of the bundle (`sha256sum -c SHA256SUMS`)
        verification.json           this exact firmware's decode vs the reference
        memory-report.json / .txt   where every byte goes, per memory region (checked on the ELF)
        firmware/...                the ELF and every flashable image the board's build produced
        generated/...               model_def.h, model_data.c, board_def.h, plan.json, weights.img
    OUT/<name>.tar.gz               the bundle as a deterministic tarball
    OUT/measurements.json           wall-clock numbers: outside SHA256SUMS and the tarball

Nothing in the bundle depends on where or when it was made: no absolute paths, no timestamps but
SOURCE_DATE_EPOCH, no host names, no locale-dependent text.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import platform
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Callable

from . import __version__
from .build import GENERATED_DIR, prepare, run_scons
from .files import REPO, slug
from .errors import ColibriError
from .hf_import import load_checkpoint, read_json
from .pipeline import OUTPUT_FILES
from .runner import run_on_board
from .verify import compare, rates, reference_run
from .session import RunRequest, RunResult
from .sampling import SamplingParams
from .targets import Board, load_board

RELEASE_FORMAT = "colibri-release-1"
MANIFEST = "manifest.json"
SIGNATURE = "manifest.json.sig"
SUMS = "SHA256SUMS"
VERIFICATION = "verification.json"
REPORT_JSON = "memory-report.json"
REPORT_TEXT = "memory-report.txt"
MEASUREMENTS = "measurements.json"
FIRMWARE_DIR = "firmware"

# The verification decode every release records: greedy, a fixed tokenizer-free prompt (the
# model's BOS token, then ids spread over the vocabulary, as `bench` uses), a fixed step count.
DEFAULT_STEPS = 32
DEFAULT_PROMPT_TOKENS = 8
# Model files that are not build inputs but belong with the model a release was made from.
MODEL_EXTRA_FILES = ("tokenizer.json", "tokenizer_config.json")
# What the firmware is made from, besides the model and the board file (hashed into the manifest).
SOURCE_PATHS = ("SConstruct", "site_scons", "generator", "templates", "firmware_src")
# Python packages whose version can change the bytes of a release.
BUILD_PACKAGES = ("numpy", "jinja2", "scons", "pyelftools", "esptool")
# Boards whose runner works here without hardware.
RUNNABLE = ("process", "qemu-system")
# Hello-frame fields that describe the firmware itself, recorded in verification.json. The others
# describe the machine it ran on (e.g. `kernels`, chosen at run time from the CPU's features) and go
# to measurements.json.
HELLO_IDENTITY = ("proto", "fw", "board", "arch", "quant", "ctx", "vocab", "model", "weights", "build")

Progress = Callable[[str], None] | None


# ---- small deterministic helpers -------------------------------------------------------------

def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def json_bytes(obj) -> bytes:
    """The one JSON spelling used in a bundle: sorted keys, ASCII, two-space indent, final newline."""
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=True) + "\n").encode()


def _tool_env() -> dict[str, str]:
    """Environment for asking tools their version: untranslated, whatever the caller's locale."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C", "TZ": "UTC"}


def _first_line(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=_tool_env(), timeout=30,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return "unavailable"
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else "unavailable"


def _say(progress: Progress, message: str) -> None:
    if progress:
        progress(message)


@contextlib.contextmanager
def _environ(**values: str):
    """Set environment variables for the duration (SCons reads SOURCE_DATE_EPOCH from it)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---- where the sources come from -------------------------------------------------------------

def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, env=_tool_env(),
                              timeout=30, stdin=subprocess.DEVNULL)
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
            files += [p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                      and p.suffix != ".pyc"]
    files.append(board.path)
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
            paths = [*SOURCE_PATHS, board.path.relative_to(REPO).as_posix()]
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
    info = {"cc": board.cc, "cc_version": _first_line([board.cc, "--version"]),
            "python": platform.python_version(), "packages": {}}
    ld = _first_line([board.cc, "-print-prog-name=ld"])
    info["ld_version"] = _first_line([ld, "--version"]) if ld != "unavailable" else ld
    for name in BUILD_PACKAGES:
        if name == "esptool" and "flash" not in board.data:
            continue
        try:
            info["packages"][name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info["packages"][name] = "not installed"
    if board.runner == "process" and board.needs_emulator():
        info["emulator"] = _first_line([board.emulator[0], "--version"])
    elif board.runner == "qemu-system" and board.command:
        info["emulator"] = _first_line([board.command[0], "--version"])
    return info


# ---- the model -------------------------------------------------------------------------------

def model_files(model_dir: Path) -> list[str]:
    """Names of the model's files a release depends on (the build's inputs, then the tokenizer)."""
    checkpoint = load_checkpoint(model_dir, load_tensors=False)
    names = {Path(p).name for p in checkpoint.input_files}
    names |= {n for n in MODEL_EXTRA_FILES if (model_dir / n).is_file()}
    return sorted(names)


def _stage_model(model_dir: Path, names: list[str], dest: Path, name: str | None = None,
                 expected: dict[str, dict] | None = None) -> tuple[Path, dict[str, dict]]:
    """Hard-link (or copy) exactly `names` into dest/<name>/ (by default the model directory's own
    name, which is the model's name in the generated sources), hashing them; with `expected`, every
    file must have the recorded SHA-256. The build then sees only the release's files."""
    staged = dest / (name or model_dir.resolve().name)
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
            raise ColibriError(f"{model_dir / name} is not the file the release was made from (SHA-256 "
                               f"{hashes[name]['sha256'][:16]}…, the manifest says "
                               f"{expected[name]['sha256'][:16]}…)")
    return staged, hashes


def sampling_defaults(model_dir: Path, spec) -> dict:
    """generation_config.json's sampling settings, as `run` and `verify` apply them by default."""
    path = model_dir / "generation_config.json"
    gen = read_json(path) if path.is_file() else {}
    out = {"do_sample": gen.get("do_sample") is True, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
           "eos_token_ids": list(spec.eos_token_ids)}
    if out["do_sample"]:
        out.update(temperature=float(gen.get("temperature") or 1.0),
                   top_k=int(gen.get("top_k") if gen.get("top_k") is not None else 50),
                   top_p=float(gen.get("top_p") if gen.get("top_p") is not None else 1.0),
                   min_p=float(gen.get("min_p") or 0.0))
    return out


def default_request(spec, n_ctx: int) -> RunRequest:
    start = spec.bos_token_id if spec.bos_token_id is not None else 1
    n_prompt = max(1, min(DEFAULT_PROMPT_TOKENS, n_ctx // 4))
    prompt = [start % spec.vocab_size] + [(7919 * (i + 1)) % spec.vocab_size for i in range(n_prompt - 1)]
    steps = max(1, min(DEFAULT_STEPS, n_ctx - n_prompt + 1))
    return RunRequest(prompt, steps, SamplingParams(), stop_at_eos=False)


def _request_dict(request: RunRequest) -> dict:
    return {"prompt": list(request.prompt), "steps": request.steps, "sampling": asdict(request.sampling),
            "stop_at_eos": request.stop_at_eos}


def _request_from(data: dict) -> RunRequest:
    try:
        return RunRequest([int(t) for t in data["prompt"]], int(data["steps"]), SamplingParams(**data["sampling"]),
                          bool(data["stop_at_eos"]))
    except (KeyError, TypeError, ValueError):
        raise ColibriError("manifest.json: malformed inputs.verification (the release's decode request)") from None


def bundle_name(model_name: str, board: str, quant: str, n_ctx: int) -> str:
    return f"colibri-{slug(model_name)}-{board}-{quant}-ctx{n_ctx}"


# ---- build, verify, assemble -----------------------------------------------------------------

def _build_id(elf: Path) -> str | None:
    """The GNU build-id note of the linked firmware (a hash of its contents), if it has one."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import NoteSection

    try:
        with open(elf, "rb") as f:
            for section in ELFFile(f).iter_sections():
                if isinstance(section, NoteSection):
                    for note in section.iter_notes():
                        if note["n_type"] == "NT_GNU_BUILD_ID":
                            return note["n_desc"]
    except Exception:  # not an ELF pyelftools understands: no build id to report
        return None
    return None


def _firmware_files(board: Board, out: Path) -> list[str]:
    """Paths (relative to the build directory) of the ELF and every flashable image built."""
    names = [board.program]
    flash = board.data.get("flash") or {}
    for key in ("app_image", "flash_image"):
        if flash.get(key):
            names.append(flash[key])
    names += [i["file"] for i in flash.get("images", ()) if i.get("file")]
    found = []
    for name in dict.fromkeys(names):
        if (out / name).is_file():
            found.append(name)
        elif name in (board.program, flash.get("app_image"), flash.get("flash_image")):
            raise ColibriError(f"the {board.name} build did not produce {name}"
                               + (" (ESP-IDF is not installed here: build the project with idf.py, where it is, "
                                  "and make the release there)" if board.data.get("idf") else ""))
    return found


def _flash_layout(board: Board) -> dict | None:
    flash = board.data.get("flash")
    if not flash:
        return None
    layout = {k: flash[k] for k in ("chip", "mode", "frequency", "size") if k in flash}
    layout["images"] = [{"offset": int(i["offset"]), "file": f"{FIRMWARE_DIR}/{i['file']}"}
                        for i in flash.get("images", ())]
    if flash.get("flash_image"):
        layout["merged"] = {"offset": 0, "file": f"{FIRMWARE_DIR}/{flash['flash_image']}"}
    return layout


def _verify_firmware(board: Board, art, plan, request: RunRequest) -> tuple[dict, dict]:
    """(verification.json, measurements) for this exact firmware."""
    ref = reference_run(plan, art.weights, request)
    reference = {"tokens": ref.tokens, "logits_sha256": ref.digests, "stop_reason": ref.stop_reason}
    if ref.expert_counts:
        reference["expert_counts"] = {str(k): v for k, v in ref.expert_counts.items()}
    verification = {"format": RELEASE_FORMAT, "board": board.name, "quant": plan.quant, "n_ctx": plan.n_ctx,
                    "request": _request_dict(request), "reference": reference}
    if board.runner not in RUNNABLE:
        verification.update(ran=False, passed=None, reason=(
            f"board {board.name} runs on hardware over a serial port; nothing ran this firmware here. "
            f"`./colibri verify --board {board.name} --port PORT` with this request must reproduce the "
            f"reference's tokens and logits hashes"))
        return verification, {"ran": False}
    result: RunResult = run_on_board(board, art.program, art.weights, request, art.model_hash(),
                                     flash_image=art.flash_image)
    firmware = {"tokens": result.tokens, "logits_sha256": result.digests, "stop_reason": result.stop_reason}
    if result.expert_counts:
        firmware["expert_counts"] = {str(k): v for k, v in result.expert_counts.items()}
    comparison = compare(result, ref)
    diverged = comparison.first_divergent_step
    # A firmware whose hello frame names its weight image (SHA-256) and itself (GNU build-id) must
    # name these very files.
    identity = []
    if "weights" in result.hello and result.hello["weights"] != sha256_file(art.weights):
        identity.append(f"the hello frame reports weights {result.hello['weights'][:16]}…, "
                        f"not the SHA-256 of {art.weights.name}")
    build_id = _build_id(art.program)
    if "build" in result.hello and build_id and result.hello["build"] != build_id:
        identity.append(f"the hello frame reports build {result.hello['build'][:16]}…, not the ELF's build-id")
    passed = comparison.passed and not identity
    s = result.stats
    hello = {k: v for k, v in result.hello.items() if k in HELLO_IDENTITY}
    verification.update(ran=True, passed=passed, first_divergent_step=diverged, hello=hello, firmware=firmware)
    if identity:
        verification["identity_problems"] = identity
    n_prompt, n_decode = int(s.get("prompt", 0)), int(s.get("decode", 0))
    if "prefill_instret" in s and "decode_instret" in s:
        # Exact under qemu's -icount shift=0: part of what a rebuild must reproduce.
        pre, dec = int(s["prefill_instret"]), int(s["decode_instret"])
        verification["instructions"] = {
            "prompt_tokens": n_prompt, "decode_forward_passes": n_decode, "prefill": pre, "decode": dec,
            "prefill_per_token": pre / n_prompt if n_prompt else None,
            "decode_per_token": dec / n_decode if n_decode else None}

    r = rates(result)
    measurements = {"ran": True, "run_machine": {k: v for k, v in result.hello.items() if k not in HELLO_IDENTITY},
                    "wall_seconds": round(result.wall_seconds, 6),
                    **{k: int(s.get(k, 0)) for k in ("prefill_us", "decode_us", "forward_us")},
                    **{k: r[k] for k in ("prompt_tokens", "decode_forward_passes", "prefill_tok_s", "decode_tok_s",
                                         "forward_tok_s")}}
    return verification, measurements


def _put(src: Path, dest: Path, executable: bool = False) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    os.chmod(dest, 0o755 if executable else 0o644)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, 0o644)


def _bundle_files(bundle: Path) -> list[str]:
    return sorted(p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file())


def write_sums(bundle: Path) -> None:
    lines = [f"{sha256_file(bundle / rel)}  {rel}\n" for rel in _bundle_files(bundle) if rel != SUMS]
    _write(bundle / SUMS, "".join(lines).encode())


def write_tarball(bundle: Path, dest: Path, mtime: int) -> None:
    """The bundle as <name>/... in a tar.gz that depends only on its contents and `mtime`: sorted
    entries, one mtime, uid/gid 0 with no owner names, modes 0644/0755, gzip without a timestamp
    or file name."""
    root = PurePosixPath(bundle.name)
    entries = [(root, bundle)] + sorted(((root / p.relative_to(bundle).as_posix(), p) for p in bundle.rglob("*")),
                                        key=lambda e: e[0].parts)
    with open(dest, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for name, path in entries:
                    info = tarfile.TarInfo(str(name))
                    info.mtime, info.uid, info.gid, info.uname, info.gname = mtime, 0, 0, "", ""
                    if path.is_dir():
                        info.type, info.mode = tarfile.DIRTYPE, 0o755
                        tar.addfile(info)
                    else:
                        info.size = path.stat().st_size
                        info.mode = 0o755 if path.stat().st_mode & stat.S_IXUSR else 0o644
                        with open(path, "rb") as f:
                            tar.addfile(info, f)


@dataclass(frozen=True)
class _Inputs:
    board: Board
    model_dir: Path  # the staged copy: exactly the release's model files
    model_hashes: dict
    quant: str
    ctx: int | None
    source_date_epoch: int
    request: RunRequest | None  # None: the default for the model and context


@dataclass
class _Produced:
    bundle: Path
    tarball: Path
    manifest: dict
    verification: dict
    measurements: dict


def _produce(inp: _Inputs, work: Path, progress: Progress, sign_key: Path | None = None,
             signature: bytes | None = None, require_pass: bool = True) -> _Produced:
    """Build, verify and assemble one bundle (and its tarball) under `work`."""
    board = inp.board
    t0 = time.monotonic()
    req, plan = prepare(board, inp.model_dir, inp.quant, inp.ctx, work / "build")
    request = inp.request or default_request(plan.spec, plan.n_ctx)
    if len(request.prompt) + request.steps - 1 > plan.n_ctx:
        raise ColibriError("the release's verification request does not fit its context")
    name = bundle_name(plan.spec.name, board.name, plan.quant, plan.n_ctx)
    _say(progress, f"building {name} in a private build directory (SOURCE_DATE_EPOCH={inp.source_date_epoch})")
    echo = (lambda line: progress(f"  {line.strip()}")) if progress else None
    with _environ(SOURCE_DATE_EPOCH=str(inp.source_date_epoch)):
        art = run_scons(req, echo)
    build_seconds = time.monotonic() - t0
    if not art.program.is_file():
        raise ColibriError(f"the {board.name} build did not produce {board.program}"
                           + (" (ESP-IDF is not installed here: make the release where idf.py is)"
                              if board.data.get("idf") else ""))
    if board.runner in RUNNABLE:
        _say(progress, f"verifying the {board.name} firmware against the NumPy reference")
    else:
        _say(progress, f"computing the reference result a {board.name} board must reproduce (none here to run it)")
    verification, measurements = _verify_firmware(board, art, plan, request)
    if verification["ran"] and not verification["passed"] and require_pass:
        step = verification["first_divergent_step"]
        if verification.get("identity_problems"):
            why = "; ".join(verification["identity_problems"])
        elif step is not None:
            why = f"it differs from the NumPy reference from step {step} on"
        else:
            why = "its expert routing differs from the NumPy reference's"
        raise ColibriError(f"the {board.name} firmware failed its verification ({why}); no release made")

    from .elfsize import read_elf
    from .report import format_report, report_dict

    bundle = work / "bundle" / name
    bundle.mkdir(parents=True)
    firmware_files = _firmware_files(board, art.out_dir)
    for rel in firmware_files:
        _put(art.out_dir / rel, bundle / FIRMWARE_DIR / rel,
             executable=(rel == board.program and board.runner == "process"))
    for gen_name in OUTPUT_FILES:
        _put(art.generated / gen_name, bundle / GENERATED_DIR / gen_name)
    report = report_dict(board, plan, read_elf(art.program))
    _write(bundle / REPORT_JSON, json_bytes(report))
    _write(bundle / REPORT_TEXT, (format_report(report) + "\n").encode())
    _write(bundle / VERIFICATION, json_bytes(verification))

    outputs = {rel: {"sha256": sha256_file(bundle / rel), "size": (bundle / rel).stat().st_size}
               for rel in _bundle_files(bundle)}
    spec = plan.spec
    manifest = {
        "format": RELEASE_FORMAT,
        "name": name,
        "board": {"name": board.name, "description": board.description,
                  "file": board.path.relative_to(REPO).as_posix(), "sha256": sha256_file(board.path)},
        "inputs": {
            "model": {"name": spec.name, "architecture": spec.architecture, "files": inp.model_hashes},
            "quant": plan.quant,
            "ctx": plan.n_ctx,
            "sampling_defaults": sampling_defaults(inp.model_dir, spec),
            "verification": _request_dict(request),
        },
        "generator": source_info(board),
        "toolchain": toolchain_info(board),
        "flags": {"cflags": list(board.cflags), "ldflags": list(board.ldflags), "libs": list(board.libs),
                  "linker_script": board.linker_script},
        "source_date_epoch": inp.source_date_epoch,
        "model_hash": art.model_hash(),
        "weights": {"file": f"{GENERATED_DIR}/{art.weights.name}",
                    "sha256": outputs[f"{GENERATED_DIR}/{art.weights.name}"]["sha256"]},
        "firmware": {"file": f"{FIRMWARE_DIR}/{board.program}", "build_id": _build_id(art.program)},
        "flash": _flash_layout(board),
        "verified": verification["passed"],
        "outputs": outputs,
    }
    manifest_bytes = json_bytes(manifest)
    _write(bundle / MANIFEST, manifest_bytes)
    if sign_key is not None:
        signature = sign_manifest(manifest_bytes, sign_key)
    if signature is not None:
        _write(bundle / SIGNATURE, signature)
    write_sums(bundle)
    for d in [bundle, *(p for p in bundle.rglob("*") if p.is_dir())]:
        os.chmod(d, 0o755)
    tarball = work / "bundle" / f"{name}.tar.gz"
    write_tarball(bundle, tarball, inp.source_date_epoch)
    measurements = {"name": name, "board": board.name, "build_seconds": round(build_seconds, 3),
                    "note": "wall-clock measurements on the machine that made the release; they differ from "
                            "run to run and are not part of the bundle, SHA256SUMS or the tarball",
                    **measurements}
    return _Produced(bundle, tarball, manifest, verification, measurements)


# ---- signing ---------------------------------------------------------------------------------

def _read_key_file(path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ColibriError(f"cannot read key {path}: {e.strerror}") from None


def load_private_key(path: Path):
    """An ed25519 private key: PEM (PKCS#8, as `openssl genpkey -algorithm ed25519` writes) or
    OpenSSH (`ssh-keygen -t ed25519`), unencrypted."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    data = _read_key_file(path)
    key = None
    for loader in (serialization.load_pem_private_key, serialization.load_ssh_private_key):
        try:
            key = loader(data, password=None)
            break
        except TypeError:
            raise ColibriError(f"{path}: the key is encrypted; give an unencrypted ed25519 key") from None
        except Exception:  # cryptography raises ValueError or UnsupportedAlgorithm for another format
            continue
    if key is None:
        raise ColibriError(f"{path}: not a PEM or OpenSSH private key")
    if not isinstance(key, Ed25519PrivateKey):
        raise ColibriError(f"{path}: not an ed25519 key (releases are signed with ed25519)")
    return key


def load_public_key(path: Path):
    """An ed25519 public key: PEM (`openssl pkey -pubout`), an OpenSSH line (`ssh-ed25519 …`), or
    the private key itself (its public half is used)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

    data = _read_key_file(path)
    key = None
    for loader in (serialization.load_pem_public_key, serialization.load_ssh_public_key):
        try:
            key = loader(data)
            break
        except Exception:  # cryptography raises ValueError or UnsupportedAlgorithm
            continue
    if key is None:
        try:
            key = load_private_key(path).public_key()
        except ColibriError:
            raise ColibriError(f"{path}: not a PEM or OpenSSH ed25519 public key") from None
    if isinstance(key, Ed25519PrivateKey):
        key = key.public_key()
    if not isinstance(key, Ed25519PublicKey):
        raise ColibriError(f"{path}: not an ed25519 key (releases are signed with ed25519)")
    return key


def sign_manifest(manifest: bytes, key_path: Path) -> bytes:
    """ed25519 over the bytes of manifest.json: 64 raw bytes (deterministic for a key and manifest)."""
    return load_private_key(key_path).sign(manifest)


def signature_problem(bundle: Path, key_path: Path) -> str | None:
    from cryptography.exceptions import InvalidSignature

    key = load_public_key(key_path)
    sig, manifest = bundle / SIGNATURE, bundle / MANIFEST
    if not sig.is_file():
        return f"{SIGNATURE} is missing: the bundle is not signed"
    if not manifest.is_file():
        return f"{MANIFEST} is missing, so its signature cannot be checked"
    try:
        key.verify(sig.read_bytes(), manifest.read_bytes())
    except InvalidSignature:
        return (f"{SIGNATURE}: the signature does not verify with {Path(key_path).name} "
                f"({MANIFEST} was changed after signing, or signed with another key)")
    return None


def generate_signing_key(private_path: Path, public_path: Path) -> None:
    """Write a new ed25519 key pair: PKCS#8 PEM private key (mode 0600) and PEM public key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    Path(public_path).write_bytes(public)


# ---- make_release ----------------------------------------------------------------------------

@dataclass
class Release:
    bundle: Path
    tarball: Path
    measurements_file: Path
    manifest: dict
    verification: dict
    measurements: dict = field(default_factory=dict)

    def summary(self) -> dict:
        return {"bundle": str(self.bundle), "tarball": str(self.tarball),
                "measurements": str(self.measurements_file), "name": self.manifest["name"],
                "board": self.manifest["board"]["name"], "model_hash": self.manifest["model_hash"],
                "tarball_sha256": sha256_file(self.tarball), "signed": (self.bundle / SIGNATURE).is_file(),
                "verification": {k: self.verification.get(k) for k in ("ran", "passed", "instructions")},
                "files": len(self.manifest["outputs"])}

    def describe(self) -> str:
        v = self.verification
        if v["ran"]:
            steps = len(v["firmware"]["tokens"])
            check = f"verified on {v['board']}: {steps} tokens and per-step logits SHA-256 equal the reference"
            if "instructions" in v:
                check += f", {v['instructions']['decode_per_token']:,.0f} instructions per decoded token"
        else:
            check = "not run here (a real board): verification.json holds the reference's expected result"
        signed = ", signed" if (self.bundle / SIGNATURE).is_file() else ""
        return (f"release {self.bundle}{signed}\n  {check}\n  tarball {self.tarball} "
                f"(sha256 {sha256_file(self.tarball)})\n"
                f"  measurements (not part of the release) {self.measurements_file}")


def make_release(board_name: str, model_dir: Path | str, quant: str = "q8_0", ctx: int | None = None,
                 out_dir: Path | str = "release", sign_key: Path | str | None = None, progress: Progress = None,
                 source_date_epoch: int | None = None) -> Release:
    """Build, verify and bundle one firmware release into out_dir (see the module docstring).

    Refuses to overwrite an existing bundle and leaves nothing behind on failure."""
    from .setup_toolchain import ensure_toolchain

    board = load_board(board_name)
    model_dir = Path(model_dir)
    # Every check that needs no compiling comes first: the model, its fit, the key, the destination.
    _, plan = prepare(board, model_dir, quant, ctx)
    names = model_files(model_dir)
    if sign_key is not None:
        load_private_key(Path(sign_key))
    sde = default_source_date_epoch() if source_date_epoch is None else int(source_date_epoch)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ColibriError(f"--out {out} exists and is not a directory")
    name = bundle_name(plan.spec.name, board.name, plan.quant, plan.n_ctx)
    final, tarball = out / name, out / f"{name}.tar.gz"
    for path in (final, tarball):
        if path.exists():
            raise ColibriError(f"{path} already exists; remove it or choose another --out")
    if board.data.get("idf"):
        from .idf_project import find_idf

        if not find_idf():
            raise ColibriError(f"board {board.name} is built by ESP-IDF's idf.py, which is not installed here: "
                               f"make its release where ESP-IDF is (after `. export.sh`)")
    ensure_toolchain(board)
    with tempfile.TemporaryDirectory(prefix="colibri-release-") as tmp:
        work = Path(tmp)
        staged, hashes = _stage_model(model_dir, names, work / "model")
        inputs = _Inputs(board, staged, hashes, quant, plan.n_ctx, sde, None)
        made = _produce(inputs, work, progress, sign_key=Path(sign_key) if sign_key else None)
        if made.bundle.name != name:
            raise ColibriError(f"internal error: the bundle is named {made.bundle.name}, expected {name}")
        out.mkdir(parents=True, exist_ok=True)
        # Copied next to their place, then renamed into it: an interruption leaves no half bundle.
        partial, partial_tar = out / f".{name}.partial", out / f".{name}.tar.gz.partial"
        shutil.rmtree(partial, ignore_errors=True)
        try:
            shutil.copytree(made.bundle, partial)  # modes are copied as set (0644/0755), whatever the umask
            shutil.copyfile(made.tarball, partial_tar)
            os.replace(partial, final)
            os.replace(partial_tar, tarball)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            partial_tar.unlink(missing_ok=True)
            raise
        measurements_file = out / MEASUREMENTS
        measurements_file.write_text(json.dumps(made.measurements, indent=2, sort_keys=True) + "\n")
    _say(progress, f"wrote {final} and {tarball.name}")
    return Release(final, tarball, measurements_file, made.manifest, made.verification, made.measurements)


# ---- verify_release --------------------------------------------------------------------------

@dataclass
class VerifyResult:
    bundle: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    files_checked: int = 0
    signature_checked: bool = False
    rebuilt: bool = False
    tarball_checked: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {"bundle": self.bundle, "ok": self.ok, "problems": self.problems, "notes": self.notes,
                "files_checked": self.files_checked, "signature_checked": self.signature_checked,
                "rebuilt": self.rebuilt, "tarball_checked": self.tarball_checked}

    def describe(self) -> str:
        if self.problems:
            return "\n".join([f"FAIL: {self.bundle}: {len(self.problems)} problem(s)"]
                             + [f"  {p}" for p in self.problems])
        done = [f"{self.files_checked} files match SHA256SUMS and the manifest"]
        if self.signature_checked:
            done.append("the ed25519 signature of manifest.json verifies")
        if self.tarball_checked:
            done.append("the tarball is the bundle's canonical tarball")
        if self.rebuilt:
            done.append("a rebuild from the manifest is byte-identical, tarball included")
        return f"PASS: {self.bundle}: " + "; ".join(done)


def _unpack(tarball: Path, dest: Path) -> Path:
    """Extract a release tarball (regular files and directories under one top directory only)."""
    try:
        tar = tarfile.open(tarball, "r:gz")
    except (OSError, tarfile.TarError) as e:
        raise ColibriError(f"{tarball}: not a release tarball ({e})") from None
    top = None
    with tar:
        for member in tar:
            parts = PurePosixPath(member.name).parts
            if (not parts or member.name.startswith("/") or ".." in parts
                    or not (member.isfile() or member.isdir())):
                raise ColibriError(f"{tarball}: unsafe or unexpected entry {member.name!r}")
            if top is None:
                top = parts[0]
            if parts[0] != top:
                raise ColibriError(f"{tarball}: entries outside the bundle directory {top!r}")
            target = dest.joinpath(*parts)
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(member) as src, open(target, "wb") as f:
                shutil.copyfileobj(src, f)
            os.chmod(target, 0o755 if member.mode & stat.S_IXUSR else 0o644)
    if top is None:
        raise ColibriError(f"{tarball}: empty tarball")
    return dest / top


def _read_sums(bundle: Path, problems: list[str]) -> dict[str, str]:
    sums = {}
    path = bundle / SUMS
    if not path.is_file():
        problems.append(f"{SUMS} is missing")
        return sums
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        digest, sep, rel = line.partition("  ")
        if not sep or len(digest) != 64 or not rel:
            problems.append(f"{SUMS}: line {n} is malformed")
            continue
        sums[rel] = digest
    return sums


def check_hashes(bundle: Path, result: VerifyResult) -> dict | None:
    """Every file against SHA256SUMS and manifest.json's outputs; returns the manifest (or None)."""
    problems = result.problems
    files = set(_bundle_files(bundle))
    sums = _read_sums(bundle, problems)
    for rel in sorted(sums):
        if rel not in files:
            problems.append(f"{rel}: listed in {SUMS} but missing from the bundle")
        elif sha256_file(bundle / rel) != sums[rel]:
            problems.append(f"{rel}: SHA-256 does not match {SUMS}")
    for rel in sorted(files - set(sums) - {SUMS}):
        problems.append(f"{rel}: not listed in {SUMS} (a file was added)")
    result.files_checked = len(files)
    try:
        manifest = json.loads((bundle / MANIFEST).read_text())
        outputs = manifest["outputs"]
        if manifest.get("format") != RELEASE_FORMAT:
            problems.append(f"{MANIFEST}: format {manifest.get('format')!r} is not {RELEASE_FORMAT!r}")
    except FileNotFoundError:
        problems.append(f"{MANIFEST} is missing")
        return None
    except (ValueError, KeyError, TypeError):
        problems.append(f"{MANIFEST} is not a release manifest (malformed JSON or no outputs)")
        return None
    for rel, entry in sorted(outputs.items()):
        path = bundle / rel
        if not path.is_file():
            problems.append(f"{rel}: listed in {MANIFEST} but missing from the bundle")
        elif path.stat().st_size != entry.get("size") or sha256_file(path) != entry.get("sha256"):
            problems.append(f"{rel}: does not match the SHA-256 and size in {MANIFEST}")
    for rel in sorted(files - set(outputs) - {MANIFEST, SIGNATURE, SUMS}):
        problems.append(f"{rel}: not listed in {MANIFEST}'s outputs")
    return manifest


def _flatten(obj, prefix: str = "") -> dict[str, object]:
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: obj}


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _json_differences(a: bytes, b: bytes, limit: int = 4) -> str:
    try:
        fa, fb = _flatten(json.loads(a)), _flatten(json.loads(b))
    except ValueError:
        return ""
    keys = sorted(k for k in set(fa) | set(fb) if fa.get(k, "<absent>") != fb.get(k, "<absent>"))
    if not keys:
        return ""
    shown = "; ".join(f"{k}: {_short(fa.get(k, '<absent>'))} in the bundle, {_short(fb.get(k, '<absent>'))} "
                      f"rebuilt" for k in keys[:limit])
    more = f"; and {len(keys) - limit} more" if len(keys) > limit else ""
    return f" ({shown}{more})"


def compare_bundles(given: Path, rebuilt: Path) -> list[str]:
    """Byte-for-byte comparison, one problem per file that differs."""
    problems = []
    a, b = set(_bundle_files(given)), set(_bundle_files(rebuilt))
    for rel in sorted(a | b):
        if rel not in b:
            problems.append(f"{rel}: in the bundle but not produced by the rebuild")
        elif rel not in a:
            problems.append(f"{rel}: produced by the rebuild but missing from the bundle")
        else:
            da, db = (given / rel).read_bytes(), (rebuilt / rel).read_bytes()
            if da != db:
                detail = _json_differences(da, db) if rel.endswith(".json") else ""
                problems.append(f"{rel}: differs from the rebuild{detail}")
    return problems


def _tar_payload(path: Path) -> bytes | None:
    try:
        with gzip.open(path, "rb") as f:
            return f.read()
    except (OSError, EOFError):
        return None


def _compare_tarballs(given: Path, expected: Path, what: str) -> str | None:
    if given.read_bytes() == expected.read_bytes():
        return None
    payload = _tar_payload(given)
    if payload is not None and payload == _tar_payload(expected):
        return (f"{given.name}: the tar inside is identical to {what}, only the gzip compression differs "
                f"(another zlib?)")
    return f"{given.name}: differs from {what}"


def locate_bundle(path: Path) -> Path:
    """The bundle a user means by `path`: a bundle directory, its tarball, or the `release --out`
    directory when that holds one bundle (with several, say which there are)."""
    if not path.exists():
        raise ColibriError(f"{path} does not exist (give a release bundle directory, its .tar.gz, or the "
                           f"release's --out directory)")
    if not path.is_dir() or (path / MANIFEST).is_file():
        return path
    bundles = sorted(d.name for d in path.iterdir()
                     if d.is_dir() and not d.name.startswith(".") and (d / MANIFEST).is_file())
    if len(bundles) == 1:
        return path / bundles[0]
    if bundles:
        raise ColibriError(f"{path} holds {len(bundles)} release bundles; name one: "
                           + ", ".join(str(path / b) for b in bundles))
    tarballs = sorted(t.name for t in path.glob("*.tar.gz") if not t.name.startswith("."))
    if len(tarballs) == 1:
        return path / tarballs[0]
    if tarballs:
        raise ColibriError(f"{path} holds {len(tarballs)} release tarballs; name one: "
                           + ", ".join(str(path / t) for t in tarballs))
    raise ColibriError(f"{path} is not a release bundle (no {MANIFEST}) and holds none")


def check_release(bundle: Path | str, verify_key: Path | str | None = None, model_dir: Path | str | None = None,
                  rebuild: bool = True, progress: Progress = None) -> VerifyResult:
    """verify_release with the details (what was checked, notes) for the CLI."""
    from .setup_toolchain import ensure_toolchain

    path = locate_bundle(Path(bundle))
    result = VerifyResult(str(path))
    with tempfile.TemporaryDirectory(prefix="colibri-verify-") as tmp:
        tmp = Path(tmp)
        if path.is_dir():
            bundle_dir = path
            sibling = path.parent / f"{path.name}.tar.gz"
            tarball = sibling if sibling.is_file() else None
        else:
            tarball = path
            bundle_dir = _unpack(path, tmp / "unpacked")
        _say(progress, f"checking the hashes of {bundle_dir.name}")
        manifest = check_hashes(bundle_dir, result)
        if verify_key is not None:
            problem = signature_problem(bundle_dir, Path(verify_key))
            result.signature_checked = problem is None
            if problem:
                result.problems.append(problem)
        elif (bundle_dir / SIGNATURE).is_file():
            result.notes.append(f"{SIGNATURE} is present but was not checked (no verify key given)")
        if manifest is None:
            return result
        try:
            sde = int(manifest["source_date_epoch"])
            if manifest["name"] != bundle_dir.name:
                result.problems.append(f"{MANIFEST}: names the bundle {manifest['name']!r}, "
                                       f"its directory is {bundle_dir.name!r}")
        except (KeyError, TypeError, ValueError):
            result.problems.append(f"{MANIFEST}: no valid source_date_epoch or name")
            return result
        if tarball is not None:
            canonical = tmp / "canonical.tar.gz"
            write_tarball(bundle_dir, canonical, sde)
            problem = _compare_tarballs(tarball, canonical, "the canonical tarball of the bundle's files")
            result.tarball_checked = problem is None
            if problem:
                result.problems.append(problem)
        if not rebuild:
            result.notes.append("not rebuilt (hashes and signature only)")
            return result
        try:
            board = load_board(manifest["board"]["name"])
            model = manifest["inputs"]["model"]
            quant, ctx = manifest["inputs"]["quant"], int(manifest["inputs"]["ctx"])
            request = _request_from(manifest["inputs"]["verification"])
            expected_files = dict(model["files"])
        except (KeyError, TypeError, ValueError):
            result.problems.append(f"{MANIFEST}: the inputs needed to rebuild are missing or malformed")
            return result
        src = Path(model_dir) if model_dir is not None else REPO / "models" / model["name"]
        if not src.is_dir():
            raise ColibriError(f"the release was made from model {model['name']!r}: give its directory with "
                               f"--model (it is not at {src})")
        here = source_info(board)
        recorded = manifest.get("generator", {})
        if here.get("source_sha256") != recorded.get("source_sha256"):
            result.notes.append(f"this checkout's sources differ from the release's (commit "
                                f"{recorded.get('git_commit', '?')}): the rebuild may differ for that reason")
        ensure_toolchain(board)
        # The release's model files under the release's model name, wherever the user keeps them.
        staged, hashes = _stage_model(src, sorted(expected_files), tmp / "model", model["name"], expected_files)
        signature = (bundle_dir / SIGNATURE).read_bytes() if (bundle_dir / SIGNATURE).is_file() else None
        _say(progress, f"rebuilding {manifest['name']} from its manifest in a fresh directory")
        made = _produce(_Inputs(board, staged, hashes, quant, ctx, sde, request), tmp / "rebuild", progress,
                        signature=signature, require_pass=False)
        result.rebuilt = True
        result.problems += compare_bundles(bundle_dir, made.bundle)
        if tarball is not None:
            problem = _compare_tarballs(tarball, made.tarball, "the rebuilt tarball")
            if problem:
                result.problems.append(problem)
        if not made.verification.get("passed", True) and made.verification.get("ran"):
            result.problems.append("the rebuilt firmware does not match the NumPy reference on this machine")
    return result


def verify_release(bundle: Path | str, verify_key: Path | str | None = None, model_dir: Path | str | None = None,
                   rebuild: bool = True, progress: Progress = None) -> list[str]:
    """Problems with a release bundle (directory or .tar.gz); empty means it checks out:
    every hash, the signature when a key is given, and a byte-for-byte rebuild from the manifest
    (the model from `model_dir`, by default models/<name> of this checkout)."""
    return check_release(bundle, verify_key, model_dir, rebuild, progress).problems
