"""A release as the artifacts Linux fleets already install: a Mender artifact (module-image for the
`colibri` update module, board/colibri-mender-module) written by the real `mender-artifact`, or a
RAUC bundle (an install hook, board/colibri-rauc-hook) written by the real `rauc`. Both carry the
release's firmware, weight image and colibri-slot, and install through colibri-slot: a new slot,
its self-test there, `current` switched only on PASS.

mender-artifact 3.9 signs with RSA or ECDSA P-256 keys and rauc 1.8's CMS signatures need one of
those too, while release manifests are signed with ed25519 (signing.py): the artifact's key is its
own (--artifact-key; RAUC also needs the X.509 certificate of that key, --artifact-cert, which the
boards' keyring trusts).
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from ..errors import ColibriError
from .deploy import SLOT_SCRIPT, Payload

HERE = Path(__file__).resolve().parent
MENDER_MODULE = HERE / "board" / "colibri-mender-module"
RAUC_HOOK = HERE / "board" / "colibri-rauc-hook"
MENDER_TYPE = "colibri"  # the update module's name on the board: /usr/share/mender/modules/v3/colibri
FORMATS = ("mender", "rauc")
APT = {"mender": "mender-artifact", "rauc": "rauc squashfs-tools"}


def _tool(name: str, fmt: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise ColibriError(f"--format {fmt} needs {name} (Debian: apt-get install {APT[fmt]})")
    return found


def _run(argv: list[str], doing: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise ColibriError(f"{doing} failed: {said[-1] if said else f'exit status {done.returncode}'}")


def check_artifact_options(fmt: str | None, key: Path | None, cert: Path | None) -> None:
    """Before anything is built: the tools and keys a format needs."""
    if fmt is None:
        if key is not None or cert is not None:
            raise ColibriError("--artifact-key and --artifact-cert are for --format mender|rauc")
        return
    if fmt not in FORMATS:
        raise ColibriError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    _tool("mender-artifact" if fmt == "mender" else "rauc", fmt)
    if fmt == "rauc" and (key is None or cert is None):
        raise ColibriError(
            "--format rauc signs the bundle: give --artifact-key KEY and --artifact-cert CERT (X.509 of that key)"
        )
    for path in (key, cert):
        if path is not None and not path.is_file():
            raise ColibriError(f"{path}: no such file")


def write_mender(payload: Payload, out: Path, key: Path | None) -> Path:
    """<release>.mender beside the bundle: a module-image for the colibri update module."""
    tool = _tool("mender-artifact", "mender")
    target = out / f"{payload.name}.mender"
    with tempfile.TemporaryDirectory(prefix="colibri-mender-") as tmp:
        staged = Path(tmp)
        files = []
        for src, name in (
            (payload.program, "firmware"),
            (payload.weights, "weights.img"),
            (SLOT_SCRIPT, "colibri-slot"),
        ):
            shutil.copyfile(src, staged / name)
            files += ["-f", str(staged / name)]
        part = staged / "artifact.mender"
        argv = [
            tool,
            "write",
            "module-image",
            "-T",
            MENDER_TYPE,
            "-n",
            payload.slot,
            "-t",
            payload.board,
            "-o",
            str(part),
            *files,
        ]
        if key is not None:
            argv += ["-k", str(key)]
        _run(argv, "mender-artifact write")
        shutil.move(part, target)
    return target


def rauc_manifest(payload: Payload) -> str:
    return (
        "[update]\n"
        f"compatible=colibri-{payload.board}\n"
        f"version={payload.slot}\n\n"
        "[bundle]\nformat=verity\n\n"
        "[hooks]\nfilename=colibri-rauc-hook\n\n"
        "[image.colibri]\nfilename=colibri.tar\nhooks=install\n"
    )


def payload_tar_with_slot(payload: Payload) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, name, mode in (
            (payload.program, "firmware", 0o755),
            (payload.weights, "weights.img", 0o644),
            (SLOT_SCRIPT, "colibri-slot", 0o755),
        ):
            info = tar.gettarinfo(str(path), arcname=name)
            info.mode, info.uid, info.gid, info.uname, info.gname = mode, 0, 0, "", ""
            with open(path, "rb") as f:
                tar.addfile(info, f)
        name = payload.slot.encode() + b"\n"
        info = tarfile.TarInfo("slot")
        info.size, info.mode = len(name), 0o644
        tar.addfile(info, io.BytesIO(name))
    return buf.getvalue()


def write_rauc(payload: Payload, out: Path, key: Path, cert: Path) -> Path:
    """<release>.raucb beside the bundle: the payload as one image installed by the hook."""
    tool = _tool("rauc", "rauc")
    _tool("mksquashfs", "rauc")
    target = out / f"{payload.name}.raucb"
    with tempfile.TemporaryDirectory(prefix="colibri-rauc-") as tmp:
        content = Path(tmp) / "content"
        content.mkdir()
        (content / "manifest.raucm").write_text(rauc_manifest(payload))
        (content / "colibri.tar").write_bytes(payload_tar_with_slot(payload))
        shutil.copyfile(RAUC_HOOK, content / "colibri-rauc-hook")
        (content / "colibri-rauc-hook").chmod(0o755)
        part = Path(tmp) / "bundle.raucb"
        _run([tool, "bundle", "--cert", str(cert), "--key", str(key), str(content), str(part)], "rauc bundle")
        shutil.move(part, target)
    return target
