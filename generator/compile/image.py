"""Weight images: what the firmware loads (from a file on Linux, from flash on an MCU). Their
format, field by field, is image_format.py's table.

The model hash is SHA-256 over "colibri-image-v3\\0", the canonical ModelSpec JSON (without its
name), the quantization, the data region and then the directory: it names the weights, and the
firmware generated for them refuses any image with another hash. The image's identity, which the
firmware carries and reports, is the SHA-256 of its header and directory (`identity_sha256`): they
hold the model hash and every tensor's CRC-32, so the identity names every byte without a board
reading the whole image to check it.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import multiprocessing
import os
import struct
import zlib
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ColibriError
from ..files import atomic_output
from ..numerics import blocks as kept_blocks
from ..numerics.quantize import (
    HALF,
    INTEGER_QUANTS,
    KEPT_BLOCK_TYPES,
    QK,
    SCALE_BYTES,
    dequantize_q4_1,
    dequantize_q8_0,
    gguf_block_type,
    keep_blocks,
    quantize_q4_0,
    quantize_q4_1,
    quantize_weights_q8_0,
    unpack_q4_0,
    unpack_q4_1,
)
from . import image_format as fmt
from .layout import ImageLayout, RankImage, TensorEntry
from .plan import Plan

# Work is cut into pieces of whole rows of at most this many values (16 MB as float32): the
# memory a piece needs is bounded whatever the tensor's size, and one large tensor still spreads
# over every worker. Fixed, so the pieces, and with them the bytes, never depend on the job count.
PIECE_VALUES = 1 << 22
READ_BACK = 16 << 20  # bytes mapped at a time when the written data is checksummed
IN_FLIGHT = 4  # pieces per worker submitted ahead of the one being waited for


@dataclass(frozen=True)
class ImageWritten:
    path: Path
    model_hash: bytes
    identity: bytes  # identity_sha256 of the written image
    requantized: dict = field(default_factory=dict)  # tensor -> Error: a GGUF file's blocks quantized again


@dataclass(frozen=True)
class Piece:
    """Rows [start, stop) of one tensor and where their bytes go in the image file: a description
    (where the values are, not the values), so a worker process reads, quantizes and writes them
    itself and sends nothing back."""

    source: object  # a model-stage tensor: `.rows(start, stop)` -> float32 (stop - start, cols)
    dtype: str  # "f32" | "q8_0" | "q4_0" | "q4_1" | a kept GGUF block type ("q4_k", ...)
    start: int
    stop: int
    values_at: int  # file offset of these rows' quants (float32 values; a kept GGUF type's blocks)
    scales_at: int  # file offset of these rows' scales (q8_0, q4_0, q4_1)
    mins_at: int  # file offset of these rows' minimums (q4_1)
    keep: str = ""  # "exact": the source's own blocks, as they are; "measure": quantized again, the error measured


def spec_identity(plan: Plan) -> bytes:
    spec = plan.spec.identity()
    spec.pop("name")
    return json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()


def encode_rows(x: np.ndarray, dtype: str) -> tuple[bytes, bytes, bytes]:
    """Rows of float32 values as image bytes (quantize.py): (quants, scales, minimums) for q4_1,
    (quants, scales, b"") for q8_0 and q4_0, (little-endian float32 values, b"", b"") for f32; scales
    and minimums little-endian binary16."""
    if dtype == "f32":
        return x.astype("<f4").tobytes(), b"", b""
    if dtype == "q4_1":
        qs, d, m = quantize_q4_1(x)
        return qs.tobytes(), d.astype(HALF).tobytes(), m.astype(HALF).tobytes()
    qs, d = quantize_weights_q8_0(x) if dtype == "q8_0" else quantize_q4_0(x)
    return qs.tobytes(), d.astype(HALF).tobytes(), b""


def encode_blocks(
    blocks, dtype: str, where: str = "a tensor"
) -> tuple[np.ndarray, np.ndarray | bytes, np.ndarray | bytes]:
    """A source's own blocks (a GGUF tensor's, model/gguf/tensors.QuantBlocks) as image bytes,
    value for value: q8_0, q4_0 and q4_1 each field copied out of the file's blocks once, a kept
    GGUF type's blocks as they are; handed to pwrite as they are. A block whose binary16 d, dmin or m
    is infinite or NaN is refused (the kernels take every scale as finite), and so is an MXFP4 block
    that cannot hold finite values (blocks.bad_exponents), naming the tensor (`where`)."""
    if dtype in KEPT_BLOCK_TYPES:
        raw = blocks.block_bytes()
        if kept_blocks.bad_halves(dtype, raw):
            raise ColibriError(
                f"{where} ({kept_blocks.FORMATS[dtype].ggml_type}): a block's binary16 scale or minimum is "
                f"infinite or NaN"
            )
        if kept_blocks.bad_exponents(dtype, raw):
            raise ColibriError(
                f"{where} (MXFP4): a block's e8m0 scale is 0xFF (NaN) or makes one of its values overflow float32 "
                f'or pass the +-2^32 a weight may be (docs/numerics.md, "Non-finite values")'
            )
        return raw, b"", b""
    qs, d, m = keep_blocks(*blocks.fields(), dtype)
    return qs, d, b"" if m is None else m


@dataclass(frozen=True)
class Error:
    """How far re-quantized values moved: the largest difference and the sum of squares."""

    largest: float = 0.0
    squares: float = 0.0
    count: int = 0

    def __add__(self, other: "Error") -> "Error":
        return Error(max(self.largest, other.largest), self.squares + other.squares, self.count + other.count)

    @property
    def rms(self) -> float:
        return (self.squares / self.count) ** 0.5 if self.count else 0.0


def requantization_error(x: np.ndarray, values: bytes, scales: bytes, mins: bytes, dtype: str) -> Error:
    """The difference between rows x and what their encoding holds."""
    rows, cols = x.shape
    d = np.frombuffer(scales, HALF).reshape(rows, cols // QK)
    if dtype == "q8_0":
        y = dequantize_q8_0(np.frombuffer(values, np.int8).reshape(rows, cols), d)
    elif dtype == "q4_0":
        y = dequantize_q8_0(unpack_q4_0(np.frombuffer(values, np.uint8).reshape(rows, cols // 2)), d)
    else:
        q = unpack_q4_1(np.frombuffer(values, np.uint8).reshape(rows, cols // 2))
        y = dequantize_q4_1(q, d, np.frombuffer(mins, HALF).reshape(rows, cols // QK))
    diff = np.abs(y.astype(np.float64) - x)
    return Error(float(diff.max(initial=0.0)), float(np.square(diff).sum()), diff.size)


def _pwrite_all(fd: int, blob, offset: int) -> None:
    view = memoryview(blob).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _where(piece: Piece) -> str:
    """The piece's tensor as its file names it: "model.gguf: tensor 'blk.0.attn_q.weight'"."""
    source = piece.source
    info, path = getattr(source, "info", None), getattr(source, "path", None)
    if info is None or path is None:
        return "a tensor"
    return f"{Path(path).name}: tensor {info.name!r}"


def write_piece(piece: Piece, path: str) -> Error | None:
    """Read, encode and write one piece into the image file at its offsets (in a worker process,
    or here with one job); for a piece quantized again, how far its values moved."""
    error = None
    if piece.keep == "exact":
        values, scales, mins = encode_blocks(piece.source.blocks(piece.start, piece.stop), piece.dtype, _where(piece))
    else:
        x = piece.source.rows(piece.start, piece.stop)
        values, scales, mins = encode_rows(x, piece.dtype)
        if piece.keep == "measure":
            error = requantization_error(x, values, scales, mins, piece.dtype)
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            _pwrite_all(fd, values, piece.values_at)
            if len(scales):
                _pwrite_all(fd, scales, piece.scales_at)
            if len(mins):
                _pwrite_all(fd, mins, piece.mins_at)
        finally:
            os.close(fd)
    except OSError as e:
        raise ColibriError(f"cannot write the weight image {Path(path).name}: {e.strerror or e}") from None
    return error


@dataclass(frozen=True)
class HeldRows:
    """Rows already in memory (a tensor an importer gave as an array): a piece carries only its
    own rows to the worker."""

    values: np.ndarray
    first: int  # the tensor row values[0] is

    def rows(self, start: int, stop: int) -> np.ndarray:
        return self.values[start - self.first : stop - self.first]


def keeping(t: TensorEntry, source) -> str:
    """How a tensor of a GGUF file goes into the image: "exact" when its blocks are a type the
    plan keeps as they are, "measure" when it is quantized again (the error is reported), "" for
    everything else."""
    ggml_type = getattr(source, "ggml_type", None)
    if ggml_type is None or t.dtype == "f32":
        return ""
    dtype, exact = gguf_block_type(ggml_type)
    return "exact" if exact and dtype == t.dtype and getattr(source, "exact_blocks", False) else "measure"


def pieces(t: TensorEntry, source, data_offset: int, keep: str = "") -> list[Piece]:
    """One tensor cut into pieces of whole rows, each with its file offsets. `source` is a
    model-stage tensor (`.rows(start, stop)`, and `.blocks(start, stop)` when keep is "exact") or an
    array holding the tensor's values."""
    step = max(1, PIECE_VALUES // t.cols)
    base = data_offset + t.offset
    if t.dtype in KEPT_BLOCK_TYPES:
        row_bytes = kept_blocks.row_bytes(t.dtype, t.cols)
    else:
        row_bytes = {"f32": 4 * t.cols, "q8_0": t.cols, "q4_0": t.cols // 2, "q4_1": t.cols // 2}[t.dtype]
    row_scales = t.cols // QK * SCALE_BYTES if t.dtype in INTEGER_QUANTS else 0  # as many minimums (q4_1)
    held = np.asarray(source, dtype=np.float32).reshape(t.rows, t.cols) if isinstance(source, np.ndarray) else None
    return [
        Piece(
            source if held is None else HeldRows(held[r : r + step], r),
            t.dtype,
            r,
            min(t.rows, r + step),
            base + r * row_bytes,
            base + t.scales_offset + r * row_scales,
            base + t.mins_offset + r * row_scales,
            keep,
        )
        for r in range(0, t.rows, step)
    ]


WORKERS_PER_CORE = 2  # a worker waits on its read and its write about half the time


def default_jobs() -> int:
    """Worker processes by default: two per core this process may run on, so that one worker's
    read or write is in flight while another computes (a 17.5 GB GGUF kept exactly: 121 s with
    one worker per core, 66 s with two, on 2 cores; docs/performance.md)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores) * WORKERS_PER_CORE


def _written(work: list[Piece], path: str, jobs: int):
    """write_piece for every piece, yielding (piece, its Error or None) once it is in the file, in order: here
    with one job, else in `jobs` worker processes, a few pieces per worker ahead."""
    if jobs <= 1 or len(work) <= 1:
        for piece in work:
            yield piece, write_piece(piece, path)
        return
    # fork: a worker starts in milliseconds and re-imports nothing. A piece names where its rows
    # are (shard, offset, dtype, shape): the worker maps them from the checkpoint's file itself, so
    # no tensor passes through this process or is copied into every worker.
    pool = ProcessPoolExecutor(min(jobs, len(work)), mp_context=multiprocessing.get_context("fork"))
    try:
        pending: deque = deque()
        for piece in work:
            pending.append((piece, pool.submit(write_piece, piece, path)))
            if len(pending) >= IN_FLIGHT * jobs:
                done, future = pending.popleft()
                yield done, future.result()
        while pending:
            done, future = pending.popleft()
            yield done, future.result()
    except BrokenProcessPool:
        raise ColibriError(
            "a quantizing worker process died (killed, or out of memory?); try again with fewer --jobs"
        ) from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _checksum(fd: int, start: int, length: int, model_hash) -> int:
    """CRC-32 of `length` bytes of the file from `start`, each window also fed to the model hash.
    The bytes are read where the page cache holds them, through a mapping of one window at a time:
    no copy (a pread would copy every byte once more), and what the process maps stays one window."""
    crc = 0
    while length:
        begin = start - start % mmap.ALLOCATIONGRANULARITY  # a mapping starts on a granule
        n = min(length, READ_BACK)
        try:
            window = mmap.mmap(fd, start - begin + n, access=mmap.ACCESS_READ, offset=begin)
        except (OSError, ValueError):
            raise ColibriError(
                "the weight image being written is shorter than planned (removed or truncated?)"
            ) from None
        with window, memoryview(window) as view:
            chunk = view[start - begin :]
            crc = zlib.crc32(chunk, crc)
            model_hash.update(chunk)
            chunk.release()
        start, length = start + n, length - n
    return crc


def _let_go(fd: int, start: int, length: int) -> None:
    """Pages of the image that are written and checksummed: started towards the disk now and let
    go of once there, so that an image larger than the page cache streams out as it is made
    instead of the kernel reclaiming under pressure (measured: docs/performance.md)."""
    os.posix_fadvise(fd, start, length, os.POSIX_FADV_DONTNEED)


def write_image(plan: Plan, tensors, path: Path, jobs: int = 1, progress=None) -> ImageWritten:
    """Quantize (where the plan says) and write every tensor at its planned offset in the image
    file `path`, streaming: pieces of rows of one tensor at a time, read from the checkpoint,
    quantized and written by `jobs` worker processes; as each tensor is complete its extent is read
    back (from the page cache) for its CRC-32 and the model hash, in plan order; then the
    directory, header and trailer. `tensors` maps each planned name to a model-stage tensor
    (`.rows(start, stop)`), or to an array of its values (an importer that decodes in memory: each
    piece then carries its own rows to its worker). No process holds more than a few pieces. Written to a temporary file
    beside `path` and renamed into place at the end: a failure leaves no image behind.
    `progress(tensors_done, tensor_count, bytes_done, total_bytes)` is called as each tensor
    completes. A GGUF file's tensors whose blocks the plan keeps are copied as they are; those
    quantized again have their error measured: ImageWritten.requantized."""
    layout = plan.image
    requantized: dict[str, Error] = {}
    with atomic_output(Path(path), "r+b") as (f, tmp):
        f.truncate(layout.image_bytes)  # zero everywhere nothing is written: padding is zero
        work, last_piece = [], []
        for t in plan.tensors:
            work += pieces(t, tensors[t.name], layout.data_offset, keeping(t, tensors[t.name]))
            last_piece.append(work[-1])
        model_hash = hashlib.sha256(b"colibri-image-v3\0" + spec_identity(plan) + plan.quant.encode())
        directory = bytearray()
        written = _written(work, tmp, jobs)
        try:
            for i, t in enumerate(plan.tensors):
                for piece, error in written:
                    if error is not None:
                        requantized[t.name] = requantized.get(t.name, Error()) + error
                    if piece is last_piece[i]:
                        break
                crc = _checksum(f.fileno(), layout.data_offset + t.offset, t.extent, model_hash)
                _let_go(f.fileno(), layout.data_offset + t.offset, t.extent)
                directory += directory_entry(t, crc)
                if progress:
                    progress(i + 1, len(plan.tensors), t.offset + t.extent, layout.data_bytes)
        finally:
            written.close()  # stops the workers when something failed
        model_hash.update(directory)
        front = write_front(f, layout, image_header(plan, model_hash.digest()), directory)
    return ImageWritten(Path(path), model_hash.digest(), hashlib.sha256(bytes(front)).digest(), requantized)


def write_front(f, layout: ImageLayout, header: bytes, directory: bytes) -> bytes:
    """An image's header and directory (zero padded up to the data region) and its trailer; returns
    the front, whose SHA-256 is the image's identity."""
    front = bytearray(layout.data_offset)
    front[: len(header)] = header
    front[layout.dir_offset : layout.dir_offset + len(directory)] = directory
    f.seek(0)
    f.write(front)
    f.seek(layout.image_bytes - fmt.TRAILER_BYTES)
    f.write(struct.pack("<I", zlib.crc32(front)) + fmt.END_MAGIC)
    return bytes(front)


def directory_entry(t: TensorEntry, crc32: int) -> bytes:
    """A tensor's directory entry: its name, type, shape, place and the CRC-32 of its extent."""
    return fmt.pack(
        fmt.DIR_ENTRY,
        fmt.DIR_ENTRY_BYTES,
        name=t.name.encode(),
        dtype=fmt.DTYPE_CODES[t.dtype],
        rows=t.rows,
        cols=t.cols,
        crc32=crc32,
        offset=t.offset,
        bytes=t.nbytes,
    )


def image_header(plan: Plan, model_hash: bytes) -> bytes:
    """The image's header for plan's layout, its tensor count and quantization, and model_hash."""
    return header_for(plan.image, len(plan.tensors), fmt.QUANT_CODES[plan.quant], model_hash)


def header_for(
    layout: ImageLayout, tensor_count: int, quant_code: int, model_hash: bytes, rank: int = 0, ranks: int = 0
) -> bytes:
    """A header: a single board's whole image (rank and ranks 0), or rank `rank`'s of `ranks`."""
    return fmt.pack(
        fmt.HEADER,
        fmt.HEADER_BYTES,
        magic=fmt.MAGIC,
        version=fmt.FORMAT_VERSION,
        header_bytes=fmt.HEADER_BYTES,
        tensor_count=tensor_count,
        dir_entry_bytes=fmt.DIR_ENTRY_BYTES,
        dir_offset=layout.dir_offset,
        data_offset=layout.data_offset,
        data_bytes=layout.data_bytes,
        image_bytes=layout.image_bytes,
        model_hash=model_hash,
        quant=quant_code,
        rank=rank,
        ranks=ranks,
    )


@dataclass(frozen=True)
class ImageHeader:
    version: int
    tensor_count: int
    dir_offset: int
    data_offset: int
    data_bytes: int
    image_bytes: int
    model_hash: bytes
    quant: int


def read_header(blob) -> ImageHeader:
    """Parse and check the header and trailer of an image (bytes, or a np.memmap of the file): the
    C loader does the full check, each tensor against its CRC-32 included."""
    if len(blob) < fmt.HEADER_BYTES + fmt.TRAILER_BYTES:
        raise ColibriError(f"weight image is {len(blob)} bytes, too short to be one")
    h = fmt.unpack(fmt.HEADER, blob)
    if h["magic"] != fmt.MAGIC:
        raise ColibriError("not a Colibri weight image (bad magic)")
    if h["version"] != fmt.FORMAT_VERSION:
        raise ColibriError(
            f"weight image format version {h['version']} is not supported "
            f"(expected {fmt.FORMAT_VERSION}): regenerate it with ./colibri build"
        )
    if h["image_bytes"] != len(blob):
        raise ColibriError(f"weight image says it is {h['image_bytes']} bytes but is {len(blob)}")
    crc_at = len(blob) - fmt.TRAILER_BYTES
    (crc,) = struct.unpack_from("<I", blob, crc_at)
    data_offset = h["data_offset"]
    if (
        bytes(blob[crc_at + 4 :]) != fmt.END_MAGIC
        or not fmt.HEADER_BYTES <= data_offset <= crc_at
        or crc != zlib.crc32(blob[:data_offset])
    ):
        raise ColibriError("weight image is corrupt (CRC-32 of its header and directory mismatch)")
    return ImageHeader(
        h["version"],
        h["tensor_count"],
        h["dir_offset"],
        h["data_offset"],
        h["data_bytes"],
        h["image_bytes"],
        h["model_hash"],
        h["quant"],
    )


def identity_sha256(blob) -> bytes:
    """The image's identity (bytes, or a np.memmap of the file): SHA-256 of its header and
    directory, every byte before the data region, checked as read_header checks them."""
    return hashlib.sha256(bytes(blob[: read_header(blob).data_offset])).digest()


def map_image(path) -> np.memmap:
    """The image file mapped read-only: readers take what they need without copying the file."""
    return np.memmap(path, dtype=np.uint8, mode="r")


def _row_pieces(whole: TensorEntry, held: TensorEntry, begin: int) -> list[tuple[int, int, int]]:
    """(from, to, length) within the tensors' own bytes: the held rows' quants, scales and minimums."""
    if held.rows == whole.rows:
        return [(0, 0, whole.nbytes)]
    if whole.dtype in KEPT_BLOCK_TYPES:
        row = kept_blocks.row_bytes(whole.dtype, whole.cols)
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
        data_at = fmt.HEADER["data_offset"].read(image)
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
                directory += directory_entry(held, zlib.crc32(extent))
            header = header_for(layout, len(rank.tensors), quant_code, model_hash, rank.rank, rank.ranks)
            front = write_front(out, layout, header, directory)
    return hashlib.sha256(bytes(front)).digest()
