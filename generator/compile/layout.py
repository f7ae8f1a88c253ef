"""Plan stage, the weight image's layout: every tensor's place in the image's data region (its
block type, rows, bytes, scales and minimums), a MoE layer's experts as one group of equal extents,
the q4_0 matrices' int8 copies in RAM, and the image's header, directory and data offsets."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import ColibriError
from ..model.spec import ModelSpec, expected_shapes
from ..numerics import blocks
from ..numerics.quantize import GGUF, INTEGER_QUANTS, KEPT_BLOCK_TYPES, QK, SCALE_BYTES, gguf_block_type
from . import image_format

ALIGN = image_format.ALIGN  # tensors in the image, buffers in the arenas


def align_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class TensorEntry:
    name: str  # canonical name, e.g. "layers.0.wq"
    c_name: str  # C identifier fragment, e.g. "LAYERS_0_WQ"
    dtype: str  # "f32" | "q8_0" | "q4_0" | "q4_1" | a kept GGUF block type (numerics/blocks.py: "q4_k", ...)
    rows: int
    cols: int
    offset: int  # from the start of the image's data region; multiple of ALIGN
    nbytes: int
    scales_offset: int  # q8_0, q4_0, q4_1: where the binary16 block scales start, relative to `offset`; else 0
    expanded_offset: int = -1  # q4_0 expanded at load: where its int8 copy starts in the RAM arena
    mins_offset: int = 0  # q4_1: where the binary16 block minimums start (right after the scales); else 0

    @property
    def extent(self) -> int:
        """Its bytes and the zero padding up to the next tensor: what its CRC-32 covers."""
        return align_up(self.nbytes)


@dataclass(frozen=True)
class ExpertPart:
    """One of a routed expert's three matrices, where it lies inside its expert's extent."""

    part: str  # "w_gate" | "w_up" | "w_down"
    dtype: str
    rows: int
    cols: int
    at: int  # from its expert's first byte; multiple of ALIGN
    nbytes: int
    scales_offset: int  # as TensorEntry's, relative to the matrix
    mins_offset: int
    expanded_at: int = -1  # q4_0 expanded at load: from its expert's int8 copy's first byte


@dataclass(frozen=True)
class ExpertGroup:
    """A MoE layer's routed experts: n_experts extents of `stride` bytes one after another from
    `offset`, each its w_gate, w_up and w_down at the same places (the directory's entries
    first_tensor + 3 * expert + part). The generated C states a layer's experts this way, as one
    table row, instead of a named constant per matrix (a 30 B MoE has 18,432 of them)."""

    layer: int
    first_tensor: int  # index of expert 0's w_gate in the plan's tensors
    n_experts: int
    offset: int  # expert 0's w_gate, from the data region's start
    stride: int  # from one expert's first byte to the next's: an expert's extent, padding included
    parts: tuple[ExpertPart, ...]
    expanded_offset: int = -1  # q4_0 expanded at load: expert 0's copy in the RAM arena
    expanded_stride: int = 0

    @property
    def end(self) -> int:
        return self.offset + self.n_experts * self.stride


EXPERT_PARTS = ("w_gate", "w_up", "w_down")


def expert_groups(spec: ModelSpec, tensors: tuple[TensorEntry, ...]) -> tuple[ExpertGroup, ...]:
    """The routed experts of every MoE layer as groups. Every expert of a layer has the same shapes
    and block types (a GGUF file stores a layer's experts as one tensor; a quantization applies to
    all), so their extents share one stride: this checks it, with every offset."""
    index = {t.name: i for i, t in enumerate(tensors)}
    out = []
    for layer in range(spec.n_layers):
        first = index.get(f"layers.{layer}.experts.0.w_gate")
        if first is None:
            continue
        n = spec.n_experts
        gate0 = tensors[first]
        stride = (
            tensors[first + 3].offset - gate0.offset
            if n > 1
            else align_up(tensors[first + 2].offset + tensors[first + 2].nbytes) - gate0.offset
        )
        e_stride = (tensors[first + 3].expanded_offset - gate0.expanded_offset) if n > 1 else 0
        parts = tuple(
            ExpertPart(
                p,
                t.dtype,
                t.rows,
                t.cols,
                t.offset - gate0.offset,
                t.nbytes,
                t.scales_offset,
                t.mins_offset,
                t.expanded_offset - gate0.expanded_offset if t.expanded_offset >= 0 else -1,
            )
            for p, t in zip(EXPERT_PARTS, tensors[first : first + 3])
        )
        for e in range(n):
            for k, part in enumerate(parts):
                t = tensors[first + 3 * e + k]
                if (
                    t.name != f"layers.{layer}.experts.{e}.{part.part}"
                    or t.offset != gate0.offset + e * stride + part.at
                    or (t.dtype, t.rows, t.cols, t.nbytes, t.scales_offset, t.mins_offset)
                    != (part.dtype, part.rows, part.cols, part.nbytes, part.scales_offset, part.mins_offset)
                    or (t.expanded_offset >= 0) != (part.expanded_at >= 0)
                    or (
                        t.expanded_offset >= 0
                        and t.expanded_offset != gate0.expanded_offset + e * e_stride + part.expanded_at
                    )
                ):
                    raise ColibriError(f"internal: layer {layer}'s experts do not share one layout ({t.name})")
        if align_up(parts[2].at + parts[2].nbytes) != stride:
            raise ColibriError(f"internal: layer {layer}'s experts are not contiguous in the image")
        out.append(
            ExpertGroup(
                layer,
                first,
                n,
                gate0.offset,
                stride,
                parts,
                gate0.expanded_offset,
                e_stride if gate0.expanded_offset >= 0 else 0,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class ImageLayout:
    header_bytes: int
    dir_offset: int
    dir_bytes: int
    data_offset: int
    data_bytes: int
    image_bytes: int


def c_name(name: str) -> str:
    return name.replace(".", "_").upper()


def tensor_bytes(dtype: str, rows: int, cols: int) -> tuple[int, int, int]:
    """A tensor's bytes in the image and where its scales and minimums start (0 where it has none):
    a kept GGUF type's blocks row after row; q8_0, q4_0, q4_1 quants, zero padding to ALIGN, binary16
    scales (then q4_1's minimums); f32 values."""
    if dtype in KEPT_BLOCK_TYPES:
        return rows * blocks.row_bytes(dtype, cols), 0, 0
    if dtype in INTEGER_QUANTS:
        scales_offset = align_up(rows * cols if dtype == "q8_0" else rows * cols // 2)
        nbytes = scales_offset + rows * (cols // QK) * SCALE_BYTES
        if dtype == "q4_1":  # the binary16 minimums follow the scales
            return nbytes + rows * (cols // QK) * SCALE_BYTES, scales_offset, nbytes
        return nbytes, scales_offset, 0
    return rows * cols * 4, 0, 0


def tensor_layout(
    spec: ModelSpec, quant: str, gguf_types: dict[str, str], held_types: dict[str, str]
) -> tuple[tuple[TensorEntry, ...], int, tuple[str, ...]]:
    """Every tensor's place in the image's data region, and the matrices kept in f32 under an
    integer quantization because their rows are not whole blocks of QK (as llama.cpp does, rather
    than refusing the model). Under --quant gguf each matrix's block type is its type in the file
    (gguf_block_type); under an integer quantization a tensor the checkpoint holds in a kept block
    type (held_types) stays in it."""
    entries, kept_f32 = [], []
    cursor = 0
    for name, shape in expected_shapes(spec).items():
        block_type = gguf_block_type(gguf_types[name])[0] if quant == GGUF else quant
        if name in held_types and quant in INTEGER_QUANTS:
            block_type = gguf_block_type(held_types[name])[0]
        verbatim = len(shape) == 2 and block_type in KEPT_BLOCK_TYPES
        quantized = len(shape) == 2 and block_type in INTEGER_QUANTS
        if quantized and shape[1] % QK:
            kept_f32.append(name)
            quantized = False
        if verbatim and shape[1] % blocks.FORMATS[block_type].values:  # the GGUF reader refuses such a file
            raise ColibriError(f"{name}: rows of {shape[1]} are not whole {block_type} blocks")
        rows, cols = shape if len(shape) == 2 else (1, shape[0])
        dtype = block_type if verbatim or quantized else "f32"
        nbytes, scales_offset, mins_offset = tensor_bytes(dtype, rows, cols)
        entries.append(
            TensorEntry(name, c_name(name), dtype, rows, cols, cursor, nbytes, scales_offset, mins_offset=mins_offset)
        )
        cursor = align_up(cursor + nbytes)
    return tuple(entries), cursor, tuple(kept_f32)


def expanded_layout(tensors: tuple[TensorEntry, ...]) -> tuple[tuple[TensorEntry, ...], int]:
    """Places in the RAM arena for the int8 copies of q4_0 matrices: quants, padding to 64,
    scales, exactly the q8_0 layout, so the q8_0 kernels read them."""
    out, cursor = [], 0
    for t in tensors:
        if t.dtype == "q4_0":
            out.append(replace(t, expanded_offset=cursor))
            cursor = align_up(cursor + align_up(t.rows * t.cols) + t.rows * (t.cols // QK) * SCALE_BYTES)
        else:
            out.append(t)
    return tuple(out), cursor


def image_layout(n_tensors: int, data_bytes: int) -> ImageLayout:
    """The image's header, its directory of `n_tensors` entries, the data region, the trailer."""
    dir_bytes = image_format.DIR_ENTRY_BYTES * n_tensors
    data_offset = align_up(image_format.HEADER_BYTES + dir_bytes)
    return ImageLayout(
        image_format.HEADER_BYTES,
        image_format.HEADER_BYTES,
        dir_bytes,
        data_offset,
        data_bytes,
        data_offset + data_bytes + image_format.TRAILER_BYTES,
    )


# ---- A model split over MPI ranks (runtime/ranks.h): each rank's weight image ----------------
# A build for N ranks writes one image per rank holding only what that rank computes (image.py
# write_rank_image):
# - a matrix whose product is split by output rows (split_tensors) holds the rank's rows
#   [rows*r/N, rows*(r+1)/N) only: runtime/ranks/mpi.c's first_row, the same rule; but the
#   queries', keys', values' (and output gate's) matrices of an attention layer split by KV group
#   (kv_group_split) hold the rows of the rank's KV groups [G*r/N, G*(r+1)/N) only, whole heads;
# - routed expert e lives on rank e mod N: a rank holds its own experts, one after another at the
#   layer's stride (expert e at local place e div N); another rank's expert is a directory entry of
#   no rows and no bytes;
# - what every rank reads whole (the embedding: a row per token, and the tied output; a per-layer
#   embedding; latent attention's per-head blocks wk_b and wv_b; norms, biases) is whole in each.
# Each rank image keeps the whole image's directory (the same entries, in the same order, each with
# the rank's rows, place and CRC-32), so the firmware's checks are the single image's; its header
# names the rank and the rank count and carries the whole model's hash (the model's identity).

# A layer's matrices that are not named w*: ColibriMatrix fields (emit.py's bindings)
LINEAR_LAYER_MATRICES = ("lin_qkv", "lin_z", "lin_b", "lin_a", "lin_out")
SHORT_CONV_LAYER_MATRICES = ("conv_in", "conv_out")
MAMBA2_LAYER_MATRICES = ("ssm_in", "ssm_out")
GEMMA4_LAYER_MATRICES = ("ple_gate", "ple_proj")


def is_matrix_part(part: str) -> bool:
    """Whether a layer's tensor `part` (wq, conv_in, ...) is a ColibriMatrix field, not a vector."""
    return (
        part.startswith("w")
        or part in LINEAR_LAYER_MATRICES
        or part in GEMMA4_LAYER_MATRICES
        or part in SHORT_CONV_LAYER_MATRICES
        or part in MAMBA2_LAYER_MATRICES
    )


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


def kv_group_split(spec: ModelSpec, ranks: int) -> tuple[bool, ...]:
    """Per layer: whether its attention is split by KV group over `ranks` ranks, the one place
    that decides (the plan's kv_split, model_def.h's colibri_layer_kv_split, the rank images' rows).
    Rank r then computes KV groups [G*r/N, G*(r+1)/N) of the layer's G (kv_groups): their query
    heads', keys' and values' rows, their RoPE and per-head norms, their part of the KV cache and
    their heads' attention, each the single board's; the heads' outputs are gathered once, before
    the output projection. Every other layer keeps the split by rows (q, k and v each gathered,
    attention on every rank over the whole cache), where a split by group would not pay or not
    keep the bits:
    - fewer KV groups than ranks (a rank would hold none);
    - q/k norms over all the heads' queries (qk_norm_whole, OLMoE): each needs the whole vector;
    - latent attention (the DeepSeek line, GLM-4.x): one latent row per position for every head;
    - DeltaNet, short convolution and Mamba-2 layers: no KV cache, no heads;
    - a KV-sharing layer (Gemma 4) follows its source, whose cache it reads."""

    def splits(layer: int) -> bool:
        return (
            ranks > 1
            and layer >= 0
            and not spec.kv_lora_rank
            and not (spec.qk_norm and spec.qk_norm_whole)
            and not (spec.is_linear(layer) or spec.is_short_conv(layer) or spec.is_mamba(layer))
            and spec.layer_kv_heads(layer) >= ranks
        )

    return tuple(splits(spec.kv_source(i)) for i in range(spec.n_layers))


def kv_groups(groups: int, rank: int, ranks: int) -> tuple[int, int]:
    """Rank `rank`'s KV groups [begin, end) of a layer split by KV group (ranks/mpi.c's ranks_kv_groups)."""
    return first_row(groups, rank, ranks), first_row(groups, rank + 1, ranks)


def kv_heads_held(spec: ModelSpec, split: tuple[bool, ...], ranks: int, layer: int) -> int:
    """The KV heads a rank's cache keeps of a layer: its KV groups where the layer is split by KV
    group (every rank's part of the arena sized for the most any rank holds, G/N rounded up, so
    one firmware serves every rank), else all of them."""
    heads = spec.layer_kv_heads(layer)
    return -(-heads // ranks) if split[layer] else heads


# A split layer's matrices of its heads: the rows of the rank's KV groups
HEAD_MATRIX_PARTS = ("wq", "wq_gate", "wk", "wv")


def rank_rows(spec: ModelSpec, split: tuple[bool, ...], t: TensorEntry, rank: int, ranks: int) -> tuple[int, int]:
    """The rows [begin, end) rank `rank` holds and computes of a matrix split over the ranks: its
    KV groups' heads for a head matrix of a layer split by KV group, else its even share of rows."""
    layer, _, part = t.name.removeprefix("layers.").partition(".")
    if t.name.startswith("layers.") and part in HEAD_MATRIX_PARTS and split[int(layer)]:
        groups = spec.layer_kv_heads(int(layer))
        begin, end = kv_groups(groups, rank, ranks)
        return t.rows // groups * begin, t.rows // groups * end
    return first_row(t.rows, rank, ranks), first_row(t.rows, rank + 1, ranks)


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
    by_group = kv_group_split(spec, ranks)
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
        begin, end = rank_rows(spec, by_group, t, rank, ranks) if t.name in split else (0, t.rows)
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
