"""Release stage: a reproducible, verifiable firmware bundle for one (board, model, quant, ctx).

    make_release()    build in a private directory, verify the firmware against the NumPy
                      reference (boards that run here), assemble the bundle, sum it, tar it
    verify_release()  check every hash (and the ed25519 signature), rebuild from the manifest in a
                      fresh directory and compare byte for byte, naming each file that differs

Layout of `make_release(..., out_dir=OUT)` (docs/releases.md):

    OUT/<name>/                     the bundle (name: colibri-<model>-<board>-<quant>-ctx<N>[-ranks<R>])
        manifest.json               inputs, generator, toolchain, flags, SOURCE_DATE_EPOCH, outputs
        manifest.json.sig           ed25519 signature of manifest.json (64 raw bytes), when signed
        SHA256SUMS                  every other file of the bundle (`sha256sum -c SHA256SUMS`)
        verification.json           this exact firmware's decode vs the reference
        memory-report.json / .txt   where every byte goes, per memory region (checked on the ELF)
        firmware/...                the ELF and every flashable image the board's build produced
        generated/...               model_def.h, model_data.c, board_def.h, image_format.h, plan.json, weights.img
                                    (and a build for N MPI ranks, weights.rank0.img ... rank{N-1}: bundle.py)
    OUT/<name>.tar.gz               the bundle as a deterministic tarball
    OUT/<name>.measurements.json    wall-clock numbers: outside SHA256SUMS and the tarball

Nothing in the bundle depends on where or when it was made: no absolute paths, no timestamps but
SOURCE_DATE_EPOCH, no host names, no locale-dependent text.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..boards import Board, board_reference, load_board
from ..compile.build import GENERATED_DIR, check_out_dir
from ..compile.firmware_id import elf_build_id
from ..compile.pipeline import OUTPUT_FILES, SELFTEST_CHECKS_FILE, SELFTEST_DATA_FILE
from ..device.session import RunRequest
from ..errors import ColibriError
from ..files import REPO
from ..job import JobOptions, compile_build, plan_build
from .bundle import (
    FIRMWARE_DIR,
    MANIFEST,
    MEASUREMENTS_SUFFIX,
    RELEASE_FORMAT,
    REPORT_JSON,
    REPORT_TEXT,
    SIGNATURE,
    VERIFICATION,
    Progress,
    bundle_files,
    firmware_files,
    flash_layout,
    json_bytes,
    local_ranks,
    put,
    rank_entries,
    say,
    sha256_file,
    write_file,
    write_sums,
    write_tarball,
)
from .provenance import (
    bundle_name,
    default_request,
    default_source_date_epoch,
    model_files,
    request_dict,
    sampling_defaults,
    source_info,
    stage_model,
    toolchain_info,
)
from .signing import load_private_key, sign_manifest
from .verification import verify_firmware


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


@dataclass(frozen=True)
class Inputs:
    board: Board
    model_dir: Path  # the staged copy: exactly the release's model files
    model_hashes: dict
    quant: str | None  # None: the model's default
    ctx: int | None
    source_date_epoch: int
    request: RunRequest | None  # None: the default for the model and context
    jobs: int | None = None  # quantizing worker processes (not part of the release: same bytes at any count)
    ranks: int = 1  # MPI ranks the weights are split over (one image each); 1: a single board's build


@dataclass
class Produced:
    bundle: Path
    tarball: Path
    manifest: dict
    verification: dict
    measurements: dict


def produce(
    inp: Inputs,
    work: Path,
    progress: Progress,
    sign_key: Path | None = None,
    signature: bytes | None = None,
    require_pass: bool = True,
) -> Produced:
    """Build, verify and assemble one bundle (and its tarball) under `work`."""
    board = inp.board
    t0 = time.monotonic()
    # Planned and compiled as every command's build is (job.py), in a private build directory.
    planned = plan_build(
        JobOptions(
            board=board.name, model=inp.model_dir, quant=inp.quant, ctx=inp.ctx, out=work / "build", ranks=inp.ranks
        )
    )
    plan = planned.plan
    request = inp.request or default_request(plan.spec, plan.n_ctx)
    if len(request.prompt) + request.steps - 1 > plan.n_ctx or request.steps < 1:
        raise ColibriError("the release's verification request does not fit its context")
    if not request.prompt or not all(0 <= t < plan.spec.vocab_size for t in request.prompt):
        raise ColibriError(
            f"the release's verification prompt is empty or not ids of the model's {plan.spec.vocab_size} tokens"
        )
    name = bundle_name(plan.spec.name, board.name, plan.quant, plan.n_ctx, plan.ranks)
    say(progress, f"building {name} in a private build directory (SOURCE_DATE_EPOCH={inp.source_date_epoch})")
    echo = (lambda line: progress(f"  {line.strip()}")) if progress else None
    with _environ(SOURCE_DATE_EPOCH=str(inp.source_date_epoch)):
        # From the sources, never from the build cache: the bundle is what this checkout compiles
        # to, and verify-release's rebuild must compile too for its comparison to prove anything.
        art = compile_build(planned, quiet=True, jobs=inp.jobs, echo=echo, cache_dir="off")
    build_seconds = time.monotonic() - t0
    if not art.program.is_file():
        raise ColibriError(
            f"the {board.name} build did not produce {board.program}"
            + (" (ESP-IDF is not installed here: make the release where idf.py is)" if board.is_esp_idf else "")
        )
    if board.runner.runs_here:
        say(progress, f"verifying the {board.name} firmware against the NumPy reference")
    else:
        say(progress, f"computing the reference result a {board.name} board must reproduce (none here to run it)")
    verification, measurements = verify_firmware(board, art, plan, request, hosts=local_ranks(plan.ranks))
    if verification["ran"] and not verification["passed"] and require_pass:
        step = verification["first_divergent_step"]
        if verification.get("identity_problems"):
            why = "; ".join(verification["identity_problems"])
        elif step is not None:
            why = f"it differs from the NumPy reference from step {step} on"
        else:
            why = "its expert routing differs from the NumPy reference's"
        raise ColibriError(f"the {board.name} firmware failed its verification ({why}); no release made")

    from ..compile.elfsize import read_elf
    from ..report import format_report, linked_report

    bundle = work / "bundle" / name
    bundle.mkdir(parents=True)
    board_files = firmware_files(board, art.out_dir)
    for rel in board_files:
        put(
            art.out_dir / rel,
            bundle / FIRMWARE_DIR / rel,
            executable=(rel == board.program and board.runner.linux_program),
        )
    for gen_name in (*OUTPUT_FILES, SELFTEST_DATA_FILE, SELFTEST_CHECKS_FILE):  # the self-test's golden vectors too
        put(art.generated / gen_name, bundle / GENERATED_DIR / gen_name)
    rank_images = art.rank_weights()
    for image in rank_images:
        put(image, bundle / GENERATED_DIR / image.name)
    report = linked_report(board, plan, read_elf(art.program))
    write_file(bundle / REPORT_JSON, json_bytes(report.to_json()))
    write_file(bundle / REPORT_TEXT, (format_report(report) + "\n").encode())
    write_file(bundle / VERIFICATION, json_bytes(verification))

    outputs = {
        rel: {"sha256": sha256_file(bundle / rel), "size": (bundle / rel).stat().st_size}
        for rel in bundle_files(bundle)
    }
    spec = plan.spec
    manifest = {
        "format": RELEASE_FORMAT,
        "name": name,
        "board": {
            "name": board.name,
            "description": board.description,
            "file": board.path.relative_to(REPO).as_posix(),
            "sha256": sha256_file(board.path),
        },
        "inputs": {
            "model": {"name": spec.name, "architecture": spec.architecture, "files": inp.model_hashes},
            "quant": plan.quant,
            "ctx": plan.n_ctx,
            "sampling_defaults": sampling_defaults(inp.model_dir, spec),
            "verification": request_dict(request),
        },
        "generator": source_info(board),
        "toolchain": toolchain_info(board),
        "flags": {
            "cflags": list(board.cflags),
            "ldflags": list(board.ldflags),
            "libs": list(board.libs),
            "linker_script": board.linker_script,
        },
        "source_date_epoch": inp.source_date_epoch,
        "model_hash": art.model_hash(),
        "weights": {
            "file": f"{GENERATED_DIR}/{art.weights.name}",
            "sha256": outputs[f"{GENERATED_DIR}/{art.weights.name}"]["sha256"],
        },
        "firmware": {"file": f"{FIRMWARE_DIR}/{board.program}", "build_id": elf_build_id(art.program)},
        "flash": flash_layout(board),
        "verified": verification["passed"],
        "outputs": outputs,
    }
    if rank_images:  # a single board's manifest stays as it was: no ranks key
        manifest["ranks"] = rank_entries(rank_images, outputs)
    manifest_bytes = json_bytes(manifest)
    write_file(bundle / MANIFEST, manifest_bytes)
    if sign_key is not None:
        signature = sign_manifest(manifest_bytes, sign_key)
    if signature is not None:
        write_file(bundle / SIGNATURE, signature)
    write_sums(bundle)
    for d in [bundle, *(p for p in bundle.rglob("*") if p.is_dir())]:
        os.chmod(d, 0o755)
    tarball = work / "bundle" / f"{name}.tar.gz"
    write_tarball(bundle, tarball, inp.source_date_epoch)
    measurements = {
        "name": name,
        "board": board.name,
        "build_seconds": round(build_seconds, 3),
        "note": "wall-clock measurements on the machine that made the release; they differ from "
        "run to run and are not part of the bundle, SHA256SUMS or the tarball",
        **measurements,
    }
    return Produced(bundle, tarball, manifest, verification, measurements)


@dataclass
class Release:
    bundle: Path
    tarball: Path
    measurements_file: Path
    # The bundle's documents as written (manifest.json, verification.json) and the measurements file's.
    manifest: dict[str, Any]
    verification: dict[str, Any]
    measurements: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, object]:
        """release --json's document."""
        return {
            "bundle": str(self.bundle),
            "tarball": str(self.tarball),
            "measurements": str(self.measurements_file),
            "name": self.manifest["name"],
            "board": self.manifest["board"]["name"],
            "model_hash": self.manifest["model_hash"],
            "tarball_sha256": sha256_file(self.tarball),
            "signed": (self.bundle / SIGNATURE).is_file(),
            "verification": {k: self.verification.get(k) for k in ("ran", "passed", "instructions")},
            "files": len(self.manifest["outputs"]),
            **({"ranks": self.manifest["ranks"]["count"]} if "ranks" in self.manifest else {}),
        }

    def describe(self) -> str:
        v = self.verification
        if v["ran"]:
            steps = len(v["firmware"]["tokens"])
            check = f"verified on {v['board']}: {steps} tokens and per-step logits SHA-256 equal the reference"
            if "instructions" in v:
                counts = v["instructions"]
                check += f", {counts['decode_per_token']:,.0f} instructions per decoded token" + (
                    f" ({counts['counted']})" if counts.get("counted") else ""
                )
        else:
            check = "not run here (a real board): verification.json holds the reference's expected result"
        signed = ", signed" if (self.bundle / SIGNATURE).is_file() else ""
        if "ranks" in self.manifest:
            check += f"\n  {self.manifest['ranks']['count']} ranks, each its own weight image in the bundle"
        return (
            f"release {self.bundle}{signed}\n  {check}\n  tarball {self.tarball} "
            f"(sha256 {sha256_file(self.tarball)})\n"
            f"  measurements (not part of the release) {self.measurements_file}"
        )


def make_release(
    board_name: str,
    model_dir: Path | str,
    quant: str | None = None,
    ctx: int | None = None,
    out_dir: Path | str = "release",
    sign_key: Path | str | None = None,
    progress: Progress = None,
    source_date_epoch: int | None = None,
    jobs: int | None = None,
    ranks: int | None = None,
) -> Release:
    """Build, verify and bundle one firmware release into out_dir (see the module docstring).

    Refuses to overwrite an existing bundle and leaves nothing behind on failure."""
    from ..device.setup_toolchain import ensure_toolchain

    out = check_out_dir(out_dir)  # before any work: a bad --out is said at once, not after the build
    board = load_board(board_name)
    if board_reference(board) != board.name:
        raise ColibriError(
            f"release: {board.path} is not a board file of targets/: a release is rebuilt from the "
            "repository's own sources, so its board must be one of them"
        )
    model_dir = Path(model_dir)
    # Every check that needs no compiling comes first: the model, its fit, the key, the destination.
    plan = plan_build(JobOptions(board=board.name, model=model_dir, quant=quant, ctx=ctx, ranks=ranks)).plan
    names = model_files(model_dir)
    if sign_key is not None:
        load_private_key(Path(sign_key))
    sde = default_source_date_epoch() if source_date_epoch is None else int(source_date_epoch)
    name = bundle_name(plan.spec.name, board.name, plan.quant, plan.n_ctx, plan.ranks)
    final, tarball, measurements_file = out / name, out / f"{name}.tar.gz", out / f"{name}{MEASUREMENTS_SUFFIX}"
    for path in (final, tarball, measurements_file):
        if path.exists():
            raise ColibriError(f"{path} already exists; remove it or choose another --out")
    if board.is_esp_idf:
        from ..compile.esp32.idf_build import find_idf

        if not find_idf():
            raise ColibriError(
                f"board {board.name} is built by ESP-IDF's idf.py, which is not installed here: "
                f"make its release where ESP-IDF is (after `. export.sh`)"
            )
    ensure_toolchain(board)
    with tempfile.TemporaryDirectory(prefix="colibri-release-") as tmp:
        work = Path(tmp)
        staged, hashes = stage_model(model_dir, names, work / "model")
        inputs = Inputs(board, staged, hashes, quant, plan.n_ctx, sde, None, jobs, plan.ranks)
        made = produce(inputs, work, progress, sign_key=Path(sign_key) if sign_key else None)
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
        measurements_file.write_text(json.dumps(made.measurements, indent=2, sort_keys=True) + "\n")
    say(progress, f"wrote {final} and {tarball.name}")
    return Release(final, tarball, measurements_file, made.manifest, made.verification, made.measurements)
