"""Plan stage, a model split over MPI ranks (runtime/ranks.h): what each rank's weight image holds
and where. A build for N ranks writes one image per rank holding only what that rank computes:

- a matrix whose product is split by output rows (every matrix `matmul` reads, split_tensors) holds
  the rank's rows [rows*r/N, rows*(r+1)/N) only — runtime/ranks/mpi.c's first_row, the same rule;
- routed expert e lives on rank e mod N: a rank holds its own experts, one after another at the
  layer's stride (expert e at local place e div N); another rank's expert is a directory entry of
  no rows and no bytes;
- everything every rank reads whole — the embedding (a row per token, and the tied output), a
  per-layer embedding, latent attention's per-head blocks (wk_b, wv_b), the norms and biases — is
  held whole by every rank.

Each rank image keeps the whole image's directory (the same entries, in the same order, each with
the rank's rows, place and CRC-32), so the firmware's checks are the single image's; its header
names the rank and the rank count, and carries the whole model's hash (the model's identity). The
firmware carries every rank image's identity and refuses another rank's, or another build's.
The bytes of a rank image are copied from the whole image's: the same quants and scales, so the
ranks compute the single board's bits."""

from __future__ import annotations

import hashlib
import mmap
import struct
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import ColibriError
from ..files import atomic_output
from ..model.spec import ModelSpec
from ..numerics import blocks
from ..numerics.quantize import INTEGER_QUANTS, KEPT_BLOCK_TYPES, QK, SCALE_BYTES
from . import image_format as fmt
from .emit import is_matrix_part
from .layout import ImageLayout, TensorEntry, align_up, expert_groups, image_layout, tensor_bytes

# Matrices read whole on every rank (never through a split product): by name, or by the end of it.
WHOLE_MATRICES = ("embed", "ple_embed")
WHOLE_MATRIX_PARTS = (".wk_b", ".wv_b")  # latent attention: one head's block of rows at a time


MAX_RANKS = 1024  # as --hosts' slots (device/hosts.py)


def check_ranks(board, ranks: int) -> int:
    """A rank count for a board: more than one only where the board's runner runs ranks."""
    if not 1 <= ranks <= MAX_RANKS:
        raise ColibriError(f"ranks must be a count from 1 to {MAX_RANKS}, got {ranks}")
    if ranks > 1 and not board.runner.runs_ranks:
        raise ColibriError(
            f"board {board.name} runs one process, not MPI ranks: build for ranks on an MPI board (host-mpi)"
        )
    return ranks


def rank_image_name(rank: int) -> str:
    return f"weights.rank{rank}.img"


def first_row(rows: int, rank: int, ranks: int) -> int:
    """Where rank `rank`'s rows of a split product start (ranks/mpi.c's first_row)."""
    return rows * rank // ranks


def bound_as_matrix(name: str) -> bool:
    """Whether a tensor is a ColibriMatrix of the firmware's weights (emit.py's bindings)."""
    if not name.startswith("layers."):
        return name in ("embed", "ple_embed", "ple_model_proj", "lm_head")
    part = name.split(".", 2)[2]
    return part in ("router", "shared_gate") or part.startswith("shared.") or is_matrix_part(part)


def split_tensors(spec: ModelSpec, tensors: tuple[TensorEntry, ...]) -> frozenset[str]:
    """The tensors whose products are split by output rows: every matrix but the routed experts'
    (computed whole where they live) and those read whole (WHOLE_MATRICES, WHOLE_MATRIX_PARTS)."""
    experts = {
        t.name for g in expert_groups(spec, tensors) for t in tensors[g.first_tensor : g.first_tensor + 3 * g.n_experts]
    }
    return frozenset(
        t.name
        for t in tensors
        if bound_as_matrix(t.name)
        and t.name not in experts
        and t.name not in WHOLE_MATRICES
        and not t.name.endswith(WHOLE_MATRIX_PARTS)
    )


@dataclass(frozen=True)
class RankImage:
    """One rank's weight image: its directory entries (the whole image's, each with the rank's
    rows, place and bytes) and the first row each holds, where each layer's experts start."""

    rank: int
    ranks: int
    tensors: tuple[TensorEntry, ...]
    first_rows: tuple[int, ...]
    group_offsets: tuple[int, ...]  # per expert group: the rank's first expert, from the data region
    image: ImageLayout
    whole_offsets: tuple[int, ...]  # where each entry's bytes come from in the whole image's data


def _rows_of(t: TensorEntry, begin: int, end: int, offset: int) -> TensorEntry:
    nbytes, scales_offset, mins_offset = tensor_bytes(t.dtype, end - begin, t.cols)
    return replace(
        t, rows=end - begin, offset=offset, nbytes=nbytes, scales_offset=scales_offset, mins_offset=mins_offset
    )


def rank_image(spec: ModelSpec, tensors: tuple[TensorEntry, ...], rank: int, ranks: int) -> RankImage:
    """Rank `rank` of `ranks`: what its image holds, and where (with one rank: the whole image)."""
    split = split_tensors(spec, tensors) if ranks > 1 else frozenset()
    groups = {g.first_tensor: g for g in expert_groups(spec, tensors)}
    entries: list[TensorEntry] = []
    firsts: list[int] = []
    sources: list[int] = []
    group_offsets: list[int] = []
    cursor, i = 0, 0
    while i < len(tensors):
        g = groups.get(i)
        if g is not None:
            group_offsets.append(cursor)
            for e in range(g.n_experts):
                for part in range(3):
                    t = tensors[i + 3 * e + part]
                    if e % ranks == rank:
                        entries.append(replace(t, offset=cursor + e // ranks * g.stride + g.parts[part].at))
                        sources.append(t.offset)
                    else:  # another rank's: no rows, no bytes
                        entries.append(replace(t, rows=0, offset=0, nbytes=0, scales_offset=0, mins_offset=0))
                        sources.append(0)
                    firsts.append(0)
            cursor += len(range(rank, g.n_experts, ranks)) * g.stride
            i += 3 * g.n_experts
            continue
        t = tensors[i]
        begin, end = (
            (first_row(t.rows, rank, ranks), first_row(t.rows, rank + 1, ranks)) if t.name in split else (0, t.rows)
        )
        held = _rows_of(t, begin, end, cursor) if t.name in split else replace(t, offset=cursor)
        entries.append(held)
        firsts.append(begin)
        sources.append(t.offset)
        cursor = align_up(cursor + held.nbytes)
        i += 1
    return RankImage(
        rank,
        ranks,
        tuple(entries),
        tuple(firsts),
        tuple(group_offsets),
        image_layout(len(entries), cursor),
        tuple(sources),
    )


def rank_images(spec: ModelSpec, tensors: tuple[TensorEntry, ...], ranks: int) -> tuple[RankImage, ...]:
    return tuple(rank_image(spec, tensors, r, ranks) for r in range(ranks))


def _row_pieces(whole: TensorEntry, held: TensorEntry, begin: int) -> list[tuple[int, int, int]]:
    """(from, to, length) within the tensors' own bytes: the held rows' quants, scales and minimums."""
    if held.rows == whole.rows:
        return [(0, 0, whole.nbytes)]
    if whole.dtype in KEPT_BLOCK_TYPES:
        row = blocks.row_bytes(whole.dtype, whole.cols)
        return [(begin * row, 0, held.rows * row)]
    if whole.dtype in INTEGER_QUANTS:
        row = whole.cols if whole.dtype == "q8_0" else whole.cols // 2
        scales = whole.cols // QK * SCALE_BYTES
        out = [
            (begin * row, 0, held.rows * row),
            (whole.scales_offset + begin * scales, held.scales_offset, held.rows * scales),
        ]
        if whole.dtype == "q4_1":
            out.append((whole.mins_offset + begin * scales, held.mins_offset, held.rows * scales))
        return out
    return [(begin * whole.cols * 4, 0, held.rows * whole.cols * 4)]


def write_rank_image(
    whole_path: Path, whole: tuple[TensorEntry, ...], rank: RankImage, model_hash: bytes, quant_code: int, path: Path
) -> bytes:
    """Rank image `rank` at `path`, its bytes copied from the whole image at `whole_path`; returns
    its identity (the SHA-256 of its header and directory, as image.identity_sha256)."""
    layout = rank.image
    with open(whole_path, "rb") as source, mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_READ) as image:
        data_at = struct.unpack_from("<Q", image, fmt.HEADER["data_offset"].offset)[0]
        directory = bytearray()
        with atomic_output(path, "r+b") as (out, _):
            out.truncate(layout.image_bytes)  # zero everywhere nothing is written: padding is zero
            for t, held, first, source_at in zip(whole, rank.tensors, rank.first_rows, rank.whole_offsets):
                extent = bytearray(held.extent)
                if held.nbytes:
                    for start, to, length in _row_pieces(t, held, first):
                        at = data_at + source_at + start
                        extent[to : to + length] = image[at : at + length]
                    out.seek(layout.data_offset + held.offset)
                    out.write(extent)
                directory += fmt.pack(
                    fmt.DIR_ENTRY,
                    fmt.DIR_ENTRY_BYTES,
                    name=held.name.encode(),
                    dtype=fmt.DTYPE_CODES[held.dtype],
                    rows=held.rows,
                    cols=held.cols,
                    crc32=zlib.crc32(extent),
                    offset=held.offset,
                    bytes=held.nbytes,
                )
            header = fmt.pack(
                fmt.HEADER,
                fmt.HEADER_BYTES,
                magic=fmt.MAGIC,
                version=fmt.FORMAT_VERSION,
                header_bytes=fmt.HEADER_BYTES,
                tensor_count=len(rank.tensors),
                dir_entry_bytes=fmt.DIR_ENTRY_BYTES,
                dir_offset=layout.dir_offset,
                data_offset=layout.data_offset,
                data_bytes=layout.data_bytes,
                image_bytes=layout.image_bytes,
                model_hash=model_hash,
                quant=quant_code,
                rank=rank.rank,
                ranks=rank.ranks,
            )
            front = bytearray(layout.data_offset)
            front[: len(header)] = header
            front[layout.dir_offset : layout.dir_offset + len(directory)] = directory
            out.seek(0)
            out.write(front)
            out.seek(layout.image_bytes - fmt.TRAILER_BYTES)
            out.write(struct.pack("<I", zlib.crc32(front)) + fmt.END_MAGIC)
    return hashlib.sha256(bytes(front)).digest()


@dataclass(frozen=True)
class RankShare:
    """What one rank holds: its weight image (mapped, read in place) and the arenas every rank
    holds whole (KV cache, scratch, tables), with the board's reserve: its memory."""

    rank: int
    image_bytes: int
    arena_bytes: int
    reserve_bytes: int

    @property
    def memory_bytes(self) -> int:
        return self.image_bytes + self.arena_bytes + self.reserve_bytes

    def to_json(self) -> dict[str, int]:
        return {"rank": self.rank, "image_bytes": self.image_bytes, "memory_bytes": self.memory_bytes}


def rank_shares(plan, reserve_bytes: int) -> tuple[RankShare, ...]:
    """Every rank's share of a build for plan.ranks ranks (`plan`: compile/plan.py's Plan)."""
    arenas = plan.context_state_bytes + plan.scratch_bytes + plan.rope_table_bytes + plan.expanded_bytes
    return tuple(
        RankShare(r, rank_image(plan.spec, plan.tensors, r, plan.ranks).image.image_bytes, arenas, reserve_bytes)
        for r in range(plan.ranks)
    )


def check_rank_budget(plan, reserve_bytes: int, budget: int, flag: str) -> tuple[RankShare, ...]:
    """--memory-budget on ranks applies to each rank: every rank's share must fit it whole (a rank
    maps its own image and reads it in place), or the first that does not is named."""
    shares = rank_shares(plan, reserve_bytes)
    for share in shares:
        if budget and share.memory_bytes > budget:
            need = max(s.memory_bytes for s in shares)
            raise ColibriError(
                f"{flag} does not hold rank {share.rank}'s share of {plan.spec.name} over {plan.ranks} ranks: "
                f"{share.memory_bytes:,} B = its weight image {share.image_bytes:,} B + KV cache, scratch and "
                f"tables {share.arena_bytes:,} B + reserve {share.reserve_bytes:,} B; give each rank at least "
                f"{need:,} B, or run over more ranks"
            )
    return shares
