"""Each MPI rank's own weight image (compile/ranks.py), before mpirun starts anything: as many images
as the hosts give ranks, and image r rank r's of this build, so a rank handed another rank's image
or another build's is refused in one line naming the rank and the image, and nothing runs. (Each
rank's firmware checks its image's identity as well: the last word, on any host.)"""

from __future__ import annotations

import re
from pathlib import Path

from ..compile import image_format as fmt
from ..compile.image import map_image, read_header
from ..compile.ranks import rank_image_name
from ..errors import ColibriError
from ..files import read_text_limited
from .hosts import explain_ranks

HOSTFILE_BYTES = 1 << 20


# A rank's own one line (bsp/linux/main.c): which rank refused which image, and why.
_RANK_REFUSED = re.compile(r"colibri: error: (rank \d+: weight image .*)")


def explain_rank_end(status: int, stderr: str, tokens: int) -> str:
    """The ranks' early end: a rank's own line when it refused its image (naming the rank and the
    image), else what mpirun said (device/hosts.py)."""
    found = _RANK_REFUSED.search(stderr)
    if found:
        return f"{found.group(1).strip()}; mpirun ended the other ranks"
    return explain_ranks(status, stderr, tokens)


def slots_given(hosts: tuple[str, ...]) -> int:
    """The ranks mpirun's host arguments (device/hosts.py hosts_for, already checked) give: the sum
    of their slots, a host without slots= counting one; none: one rank here."""
    if "--host" in hosts:
        listed = hosts[hosts.index("--host") + 1]
        return sum(int(entry.partition(":")[2] or 1) for entry in listed.split(","))
    if "--hostfile" in hosts:
        path = Path(hosts[hosts.index("--hostfile") + 1])
        total = 0
        for line in read_text_limited(path, HOSTFILE_BYTES, f"hostfile {path}").splitlines():
            words = line.split("#", 1)[0].split()
            if words:
                found = [w.split("=", 1)[1] for w in words[1:] if w.startswith("slots=")]
                total += int(found[0]) if found else 1
        return total
    return 1


def check_rank_count(images: tuple[Path, ...], hosts: tuple[str, ...]) -> None:
    """The hosts give as many ranks as the build made images for, or the run is refused."""
    given, made = slots_given(hosts), max(1, len(images))
    if given != made:
        raise ColibriError(
            f"the weight images were made for {made} rank{'s' if made > 1 else ''} and the hosts give {given}: "
            f"build for {given} (--ranks {given}), or give hosts whose slots add up to {made}"
        )


def check_rank_images(paths: tuple[Path, ...], model_hash: str) -> None:
    """Before any rank starts: image r is rank r's of len(paths), of this model (its hash), so a rank
    handed another rank's image, or another build's, is refused in one line naming both. (Each rank's
    firmware checks its image's identity too: this says it before mpirun starts anything.)"""
    for rank, path in enumerate(paths):
        try:
            blob = map_image(path)
            header = read_header(blob)
        except (OSError, ValueError) as e:
            raise ColibriError(
                f"rank {rank}: cannot read its weight image {path}: {getattr(e, 'strerror', None) or e}"
            ) from None
        except ColibriError as e:
            raise ColibriError(f"rank {rank}: weight image {path}: {e}") from None
        h = fmt.unpack(fmt.HEADER, blob)
        if header.model_hash.hex() != model_hash:
            raise ColibriError(
                f"rank {rank}: weight image {path} is another build's (model hash {header.model_hash.hex()[:12]}..., "
                f"this firmware's {model_hash[:12]}...): give each rank its image from this build"
            )
        if (h["rank"], h["ranks"]) != (rank, len(paths)):
            held = f"rank {h['rank']}'s of {h['ranks']}" if h["ranks"] else "a single board's (whole) image"
            raise ColibriError(
                f"rank {rank}: weight image {path} is {held}, not rank {rank}'s of {len(paths)}: "
                f"give rank {rank} {rank_image_name(rank)}"
            )
