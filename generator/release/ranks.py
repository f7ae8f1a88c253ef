"""A release of a build for several MPI ranks (docs/several-boards.md): every rank's weight image in
the bundle (generated/weights.rank{r}.img), the manifest's `ranks` table naming each with its SHA-256,
the model hash its header carries and its identity (the SHA-256 of its header and directory, what
the firmware holds for that rank), and verify-release's check of each image against that table.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..compile import image_format as fmt
from ..compile.build import GENERATED_DIR
from ..compile.image import identity_sha256, map_image, read_header
from ..compile.layout import rank_image_name
from ..errors import ColibriError

MAX_RANKS = 4096  # a manifest claiming more is not one this release made
RANK_IMAGE = re.compile(r"generated/weights\.rank(\d+)\.img")


def local_ranks(ranks: int) -> tuple[str, ...]:
    """mpirun's host arguments for a release's verification run: every rank on this machine."""
    return ("--host", f"localhost:{ranks}") if ranks > 1 else ()


def rank_image_file(rank: int) -> str:
    """Rank `rank`'s image's path inside a bundle."""
    return f"{GENERATED_DIR}/{rank_image_name(rank)}"


def image_fields(path: Path) -> dict[str, Any]:
    """What the manifest records of an image file (and verify-release compares): its header's rank,
    rank count and model hash, and its identity; a ColibriError when it is not a weight image."""
    if path.stat().st_size == 0:  # np.memmap cannot map an empty file
        raise ColibriError("weight image is 0 bytes, too short to be one")
    blob = map_image(path)
    header = read_header(blob)
    fields = fmt.unpack(fmt.HEADER, blob)
    return {
        "rank": fields["rank"],
        "ranks": fields["ranks"],
        "model_hash": header.model_hash.hex(),
        "identity": identity_sha256(blob).hex(),
    }


def rank_entries(images: tuple[Path, ...], outputs: dict[str, dict]) -> dict[str, Any]:
    """The manifest's `ranks`: the rank count and each rank's image, rank 0 first."""
    entries = []
    for rank, image in enumerate(images):
        file = rank_image_file(rank)
        found = image_fields(image)
        entries.append(
            {
                "rank": rank,
                "file": file,
                "sha256": outputs[file]["sha256"],
                "model_hash": found["model_hash"],
                "identity": found["identity"],
            }
        )
    return {"count": len(images), "images": entries}


def rank_count(manifest: dict[str, Any]) -> int:
    """The ranks a manifest's build was made for (1: no `ranks` table); a ColibriError when the table
    is not one a release writes."""
    table = manifest.get("ranks")
    if table is None:
        return 1
    count = table.get("count") if isinstance(table, dict) else None
    if isinstance(count, bool) or not isinstance(count, int) or not 1 < count <= MAX_RANKS:
        raise ColibriError(f"manifest.json: ranks.count {str(count)[:40]!r} is not a rank count")
    images = table.get("images")
    if not isinstance(images, list) or len(images) != count or not all(isinstance(e, dict) for e in images):
        raise ColibriError(f"manifest.json: ranks.images does not list {count} ranks' images")
    return count


def rank_problems(bundle: Path, manifest: dict[str, Any]) -> list[str]:
    """Each rank's image against the manifest's `ranks` table, one line naming the rank per image that
    is missing, altered or another rank's; called once the bundle's hashes have been checked."""
    try:
        count = rank_count(manifest)
    except ColibriError as e:
        return [str(e)]
    if count == 1:
        strays = sorted(rel for rel in manifest["outputs"] if RANK_IMAGE.fullmatch(rel))
        return [f"{rel}: a rank's weight image in a release made for one board" for rel in strays]
    problems = []
    outputs, table = manifest["outputs"], manifest["ranks"]["images"]
    for rank, entry in enumerate(table):
        file = rank_image_file(rank)
        where = f"rank {rank}: weight image {file}"
        if entry.get("rank") != rank or entry.get("file") != file:
            problems.append(f"{where}: the manifest's ranks.images[{rank}] names another rank or file")
        elif file not in outputs or not (bundle / file).is_file():
            problems.append(f"{where} is missing from the bundle")
        elif outputs[file].get("sha256") != entry.get("sha256"):
            problems.append(f"{where}: its SHA-256 is not the one the manifest's ranks table records (altered)")
        else:
            problems += _header_problems(bundle / file, where, rank, count, entry, manifest.get("model_hash"))
    made = {f"{rank_image_file(r)}" for r in range(count)}
    for rel in sorted(rel for rel in outputs if RANK_IMAGE.fullmatch(rel) and rel not in made):
        problems.append(f"{rel}: a rank's weight image beyond the {count} ranks the release was made for")
    return problems


def _header_problems(
    path: Path, where: str, rank: int, count: int, entry: dict[str, Any], model_hash: object
) -> list[str]:
    try:
        found = image_fields(path)
    except ColibriError as e:
        return [f"{where}: {e}"]
    if (found["rank"], found["ranks"]) != (rank, count):
        return [f"{where} is rank {found['rank']}'s of {found['ranks']}, not rank {rank}'s of {count} (swapped?)"]
    if found["model_hash"] != model_hash or found["model_hash"] != entry.get("model_hash"):
        return [
            f"{where} is another model's (model hash {found['model_hash'][:16]}, the release's {str(model_hash)[:16]})"
        ]
    if found["identity"] != entry.get("identity"):
        return [f"{where}: its header and directory are not the ones the manifest records (identity differs)"]
    return []


def merged_rank_problems(problems: list[str]) -> list[str]:
    """The hash check's problems with every rank image's merged into one line naming its rank (a
    rank image altered or missing is found against SHA256SUMS and the manifest both)."""
    seen: set[str] = set()
    merged = []
    for problem in problems:
        rel, sep, rest = problem.partition(": ")
        found = RANK_IMAGE.fullmatch(rel) if sep else None
        if found is None:
            merged.append(problem)
        elif rel not in seen:
            seen.add(rel)
            merged.append(f"rank {int(found.group(1))}: weight image {rel}: {rest}")
    return merged
