"""release, verify-release, deploy and rollback: a reproducible bundle, checked and rebuilt, put on
Linux boards into a new slot and switched back."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..arguments import add_jobs_arg, add_model_args, add_ranks_arg, out_dir
from ..boards import load_board
from ..console import progress
from ..documents import JsonDocument
from ..errors import ColibriError
from .common import Command, add_json_arg, print_json

if TYPE_CHECKING:
    from ..release.deploy import Deployed


def add_release_arguments(p: argparse.ArgumentParser) -> None:
    add_model_args(p)
    add_jobs_arg(p)
    add_ranks_arg(p)
    p.add_argument(
        "--out", type=out_dir, help="directory for the bundle, its .tar.gz and <bundle>.measurements.json (required)"
    )
    p.add_argument(
        "--sign",
        type=Path,
        metavar="KEY",
        help="sign manifest.json with this ed25519 private key "
        "(PEM, e.g. from `openssl genpkey -algorithm ed25519`, or OpenSSH)",
    )
    p.add_argument(
        "--format",
        choices=("mender", "rauc"),
        help="also write a Mender artifact (mender-artifact) or a RAUC bundle (rauc) of it, beside the bundle",
    )
    p.add_argument(
        "--artifact-key",
        type=Path,
        metavar="KEY",
        help="sign the Mender artifact or RAUC bundle with this RSA or ECDSA P-256 private key (PEM)",
    )
    p.add_argument(
        "--artifact-cert", type=Path, metavar="CERT", help="--format rauc: the X.509 certificate of --artifact-key"
    )
    add_json_arg(p)


def release(args: argparse.Namespace) -> int:
    from ..release.artifacts import check_artifact_options, write_mender, write_rauc
    from ..release.deploy import payload_of
    from ..release.make import make_release

    if args.out is None:
        raise ColibriError("release needs --out DIR: the directory for the bundle and its tarball")
    check_artifact_options(args.format, args.artifact_key, args.artifact_cert)
    if args.format is not None and not load_board(args.board).runner.takes_remote:
        raise ColibriError(f"--format {args.format} is for Linux boards (host, linux-aarch64), not {args.board}")
    if args.format is not None and (args.ranks or 1) > 1:
        raise ColibriError(
            f"--format {args.format} packs one board's firmware and image; a release for {args.ranks} ranks "
            "goes to its boards with deploy --inventory"
        )
    made = make_release(
        args.board,
        args.model,
        args.quant,
        args.ctx,
        args.out,
        sign_key=args.sign,
        progress=None if args.json else progress,
        jobs=args.jobs,
        ranks=args.ranks,
    )
    summary = made.summary()
    if args.format is not None:
        payload = payload_of(made.bundle)
        if args.format == "mender":
            artifact = write_mender(payload, made.bundle.parent, args.artifact_key)
        else:
            artifact = write_rauc(payload, made.bundle.parent, args.artifact_key, args.artifact_cert)
        summary[args.format] = str(artifact)
    if args.json:
        print_json(summary)
    else:
        print(made.describe())
        if args.format is not None:
            print(f"  {args.format} {summary[args.format]} (slot {payload.slot}, through colibri-slot on the board)")
    return 0


def add_verify_release_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "bundle",
        type=Path,
        help="the release bundle directory, its .tar.gz, or the release --out directory holding one bundle",
    )
    p.add_argument(
        "--verify-key", type=Path, metavar="KEY", help="ed25519 public key manifest.json must be signed with"
    )
    # Its own dest: a colibri.toml's model is a default for building, not the release's files.
    p.add_argument(
        "--model",
        dest="release_model",
        type=Path,
        metavar="DIR",
        help="directory holding the release's model files (default: models/<the release's model name>)",
    )
    p.add_argument("--no-rebuild", action="store_true", help="check hashes and the signature only")
    add_json_arg(p)


def verify_release(args: argparse.Namespace) -> int:
    from ..release.check import check_release

    if args.no_rebuild and args.release_model is not None:
        raise ColibriError(
            "--model names the model files for the rebuild, and --no-rebuild skips it: give one or the other"
        )
    result = check_release(
        args.bundle,
        verify_key=args.verify_key,
        model_dir=args.release_model,
        rebuild=not args.no_rebuild,
        progress=None if args.json else progress,
    )
    if args.json:
        print_json(result.to_json())
    else:
        for note in result.notes:
            progress(f"note: {note}")
        print(result.describe())
    return 0 if result.ok else 1


def add_deploy_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", type=Path, help="the release bundle directory (./colibri release's output)")
    p.add_argument("--remote", metavar="[USER@]HOST[:PORT]", help="the board, over SSH")
    p.add_argument(
        "--inventory", type=Path, metavar="FILE", help="an Ansible inventory: every host, by ansible-playbook"
    )
    p.add_argument(
        "--root",
        help="the slots' directory on the boards (default /opt/colibri; with --inventory: each host's colibri_root)",
    )
    add_json_arg(p)


@dataclass(frozen=True)
class Deployment(JsonDocument):
    """deploy --json's document: the release, its slot, each host's outcome."""

    release: str
    slot: str
    hosts: list[Deployed]


def deploy(args: argparse.Namespace) -> int:
    from ..device.remote import parse_remote
    from ..release.deploy import DEFAULT_ROOT, deploy_inventory, deploy_remote, payload_of

    if (args.remote is None) == (args.inventory is None):
        both = ", not both" if args.remote is not None else ""
        raise ColibriError(f"deploy needs --remote HOST (one board) or --inventory FILE (an Ansible inventory){both}")
    payload = payload_of(args.bundle)
    if args.remote is not None:
        outcomes = [deploy_remote(parse_remote(args.remote), payload, args.root or DEFAULT_ROOT)]
    else:
        outcomes = deploy_inventory(args.inventory, payload, args.root)
    if args.json:
        print_json(Deployment(payload.name, payload.slot, outcomes).to_json())
    else:
        for o in outcomes:
            print(o.line())
    return 0 if all(o.passed for o in outcomes) else 1


def add_rollback_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--remote", required=True, metavar="[USER@]HOST[:PORT]", help="the board, over SSH")
    p.add_argument("--root", default="/opt/colibri", help="the slots' directory on the board (default /opt/colibri)")
    add_json_arg(p)


@dataclass(frozen=True)
class RolledBack(JsonDocument):
    host: str
    current: str


def rollback(args: argparse.Namespace) -> int:
    from ..device.remote import parse_remote
    from ..release.deploy import rollback_remote

    current = rollback_remote(parse_remote(args.remote), args.root)
    if args.json:
        print_json(RolledBack(args.remote, current).to_json(), indent=None)
    else:
        print(f"{args.remote}: current {current}")
    return 0


COMMANDS = [
    Command("release", "build, verify and bundle a reproducible firmware release", add_release_arguments, release),
    Command(
        "verify-release",
        "check a release's hashes and signature, rebuild it from its manifest and compare byte for byte",
        add_verify_release_arguments,
        verify_release,
    ),
    Command(
        "deploy",
        "install a release on Linux boards into a new slot, run its self-test there, switch only on PASS",
        add_deploy_arguments,
        deploy,
    ),
    Command(
        "rollback", "point a Linux board's current slot back at the one it replaced", add_rollback_arguments, rollback
    ),
]
