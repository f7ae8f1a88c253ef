"""The GGUF block types kept as the file holds them (generator/numerics/blocks.py, kernels.h's
kernel_*_unpack and the scalar products): their values are the gguf package's dequantizer's bit for
bit, and the C kernels on every kernel set return the NumPy reference's bits."""

import gguf
import numpy as np
import pytest
from conftest import f32_bytes, run_harness
from gguf.quants import dequantize
from test_numerics import assert_same_bits

from generator.numerics import blocks
from generator.numerics.quantize import quantize_q8_0

rng = np.random.default_rng(11)
TYPES = sorted(blocks.FORMATS)
# binary16 scales a file may hold: zeros of both signs, the smallest subnormal and a larger one,
# negative ones, the largest finite, and ordinary ones
EDGE_HALVES = np.array([0.0, -0.0, 2**-24, -(2**-24), 3 * 2**-20, -1.5, 65504.0, -65504.0], np.float16)
# MXFP4 e8m0 exponents alike: the two subnormal scales (0, 1), the smallest normal ones, ordinary
# ones, and 2^16, the largest binary16's size (so that products stay finite as the others' do)
EDGE_EXPONENTS = np.array([0, 1, 2, 3, 64, 127, 128, 144], np.uint8)


def mxfp4_exponents(n: int, spread: float) -> np.ndarray:
    """n e8m0 bytes whose scales 2^(e - 128) are about `spread` (values up to 12 of them)."""
    centre = 128 + int(np.round(np.log2(spread)))
    return (centre + rng.integers(-3, 4, n)).astype(np.uint8)


def set_scales(dtype: str, raw: np.ndarray, pick) -> None:
    """Every scale field of blocks `raw` set from pick(kind, n): kind "half" for binary16 fields
    (float16 values), "e8m0" for MXFP4's exponent byte (uint8)."""
    f = blocks.FORMATS[dtype]
    if dtype == "mxfp4":
        raw[:, 0] = pick("e8m0", len(raw))
    for at in f.halves:
        raw[:, at : at + 2] = np.asarray(pick("half", len(raw)), np.float16).view(np.uint8).reshape(-1, 2)


def random_blocks(dtype: str, n: int, edges: bool = True, spread: float = 1.0) -> np.ndarray:
    """n blocks of random bytes whose binary16 fields are finite: the first ones edge values."""
    f = blocks.FORMATS[dtype]
    raw = rng.integers(0, 256, (n, f.nbytes), dtype=np.uint8)

    def pick(kind, count):
        h = mxfp4_exponents(count, spread) if kind == "e8m0" else rng.normal(0, spread, count).astype(np.float16)
        if edges:
            k = min(count, len(EDGE_HALVES))
            h[:k] = rng.permutation(EDGE_EXPONENTS if kind == "e8m0" else EDGE_HALVES)[:k]
        return h

    set_scales(dtype, raw, pick)
    return raw


@pytest.mark.parametrize("dtype", TYPES)
def test_values_are_the_gguf_packages_bit_for_bit(dtype):
    for edges in (True, False):
        raw = random_blocks(dtype, 200, edges)
        want = dequantize(raw, gguf.GGMLQuantizationType[blocks.FORMATS[dtype].ggml_type])
        assert_same_bits(blocks.dequantize(dtype, raw), np.asarray(want, np.float32).reshape(-1))


def test_mxfp4_values_are_the_gguf_packages_at_every_exponent_and_nibble():
    """Every e8m0 byte the package reads (all 256: ggml's decoding ignores OCP's NaN, 0xFF) with
    all 16 nibbles in both halves of the block: subnormal scales (e = 0, 1) and values that overflow
    to infinity (e >= 0xFD) included, the same bits."""
    nibbles = np.arange(16, dtype=np.uint8)
    raw = np.zeros((256, 17), np.uint8)
    raw[:, 0] = np.arange(256)
    raw[:, 1:] = nibbles | (nibbles[::-1] << 4)
    with np.errstate(over="ignore"):
        want = np.asarray(dequantize(raw, gguf.GGMLQuantizationType.MXFP4), np.float32).reshape(-1)
        assert_same_bits(blocks.dequantize("mxfp4", raw), want)
    assert_same_bits(
        blocks.e8m0_half(np.array([0, 1, 2, 127, 128, 254])), [2.0**-128, 2.0**-127, 2.0**-126, 0.5, 1, 2.0**126]
    )


def test_mxfp4_blocks_that_cannot_hold_finite_values_are_found():
    """e = 0xFF (NaN in the OCP MX spec) whatever the nibbles; a value past the +-2^32 a weight may
    be (k * 2^(e - 128): from 157 with 12, 158 with 6, ...; docs/numerics.md, "Non-finite values"),
    infinities (0xFE with 4 or more, 0xFD with 8 or more) among them; everything else is kept."""
    for e in range(256):
        for nibble in range(16):
            block = np.array([[e] + [nibble] * 16], np.uint8)
            k = abs(int(blocks.KVALUES_MXFP4[nibble]))
            bad = e == 0xFF or k * 2.0 ** (e - 128) > 2.0**32
            assert blocks.bad_exponents("mxfp4", block) == bad, (e, nibble)
    many = random_blocks("mxfp4", 40)
    assert not blocks.bad_exponents("mxfp4", many)
    many[17, 0], many[17, 9] = 0xFE, 0x70  # one value of 12 in the 18th block
    assert blocks.bad_exponents("mxfp4", many)
    assert not blocks.bad_exponents("iq4_nl", random_blocks("iq4_nl", 4))


def test_the_formats_are_ggmls_block_sizes():
    for dtype, f in blocks.FORMATS.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[f.ggml_type]] == (f.values, f.nbytes), dtype
        assert blocks.BY_GGUF[f.ggml_type] == dtype


@pytest.mark.parametrize("dtype", TYPES)
def test_c_values_are_the_references(harness, dtype):
    f = blocks.FORMATS[dtype]
    raw = random_blocks(dtype, 2 * 256 // f.values * 4)
    n32 = raw.shape[0] * f.values // 32
    got = np.frombuffer(run_harness(harness, ["blocks_values", dtype, n32], raw.tobytes()), "<f4")
    assert_same_bits(got, blocks.dequantize(dtype, raw))


def activations(cols: int, tokens: int = 1):
    x = rng.normal(0, 1, (tokens, cols)).astype(np.float32)
    x[:, 5::11] = 0.0
    return quantize_q8_0(x)


def shapes(dtype: str):
    """Rows and columns whose block counts sit around the tree's 8 partials (7, 8, 9, 16, 17 blocks
    of 32; superblock types whole superblocks: 8, 16, 24, 72)."""
    if blocks.FORMATS[dtype].values == 32:
        return [(3, 32), (5, 224), (4, 256), (3, 288), (2, 512), (6, 544)]
    return [(3, 256), (5, 512), (2, 768), (3, 2304)]


def row_blocks(dtype: str, rows: int, cols: int, edges: bool = True) -> np.ndarray:
    f = blocks.FORMATS[dtype]
    return random_blocks(dtype, rows * cols // f.values, edges, spread=0.01).reshape(rows, -1)


@pytest.mark.parametrize("dtype", TYPES)
def test_c_products_are_the_references(harness, dtype):
    for rows, cols in shapes(dtype):
        w = row_blocks(dtype, rows, cols)
        xq, xd = activations(cols)
        want = blocks.matvec(dtype, w, cols, xq[0], xd[0])
        payload = w.tobytes() + xq.tobytes() + f32_bytes(xd)
        for op in ("blocks_matvec", "blocks_scalar_matvec"):
            got = np.frombuffer(run_harness(harness, [op, dtype, rows, cols], payload), "<f4")
            assert_same_bits(got, want)


def check_batched(harness, dtype, w, rows, cols, xq, xd):
    """The harness's batched product of rows x cols blocks w: each token's rows are the reference
    matvec's bits."""
    tokens = xq.shape[0]
    payload = w.tobytes() + xq.tobytes() + f32_bytes(xd)
    got = np.frombuffer(run_harness(harness, ["blocks_matmul", dtype, tokens, rows, cols], payload), "<f4")
    got = got.reshape(tokens, rows)
    for t in range(tokens):
        assert_same_bits(got[t], blocks.matvec(dtype, w, cols, xq[t], xd[t]))


@pytest.mark.parametrize("dtype", TYPES)
def test_c_batched_products_give_each_token_the_matvec_bits(harness, dtype):
    rows, cols, tokens = 5, shapes(dtype)[1][1], 3
    w = row_blocks(dtype, rows, cols)
    xq, xd = activations(cols, tokens)
    check_batched(harness, dtype, w, rows, cols, xq, xd)


@pytest.mark.parametrize("dtype", TYPES)
def test_the_product_is_the_dot_product_of_the_values_to_float32_accuracy(dtype):
    rows, cols = 6, 512
    w = row_blocks(dtype, rows, cols, edges=False)
    xq, xd = activations(cols)
    values = blocks.dequantize(dtype, blocks.rows_of(dtype, w, cols)).reshape(rows, cols).astype(np.float64)
    x = (xq[0].reshape(-1, 32).astype(np.float64) * xd[0][:, None]).reshape(-1)
    exact = values @ x
    scale = np.abs(values) @ np.abs(x)
    assert np.all(np.abs(blocks.matvec(dtype, w, cols, xq[0], xd[0]) - exact) <= 1e-5 * scale + 1e-30)


def test_the_reduction_tree_adds_block_terms_eight_partials_apart():
    """A row of 9 blocks: the ninth block's term joins the first's partial, not the running sum."""
    dtype, cols = "q5_0", 9 * 32
    w = row_blocks("q5_0", 1, cols, edges=False)
    xq, xd = activations(cols)
    terms = blocks.block_terms(dtype, w, cols, xq[0], xd[0])[0]
    want = np.float32(-0.0) + terms[0] + terms[8]
    for k in range(1, 8):
        want = np.float32(want + terms[k])
    assert_same_bits(blocks.matvec(dtype, w, cols, xq[0], xd[0]), [want])


def test_infinite_and_nan_scales_are_found():
    for dtype, f in blocks.FORMATS.items():
        raw = random_blocks(dtype, 4)
        assert not blocks.bad_halves(dtype, raw)
        for at in f.halves:
            for bad in (np.inf, -np.inf, np.nan):
                broken = raw.copy()
                broken[2, at : at + 2] = np.array([bad], np.float16).view(np.uint8)
                assert blocks.bad_halves(dtype, broken), (dtype, at, bad)


def test_a_product_taken_a_few_rows_at_a_time_is_the_same(monkeypatch):
    from generator.numerics.ops import tree_sum

    rows, cols = 7, 512
    w = row_blocks("q4_k", rows, cols)
    xq, xd = activations(cols)
    whole = tree_sum(blocks.block_terms("q4_k", w, cols, xq[0], xd[0]))
    monkeypatch.setattr(blocks, "CHUNK_VALUES", 2 * cols)  # two rows per chunk: 4 chunks, the last of one row
    assert_same_bits(blocks.matvec("q4_k", w, cols, xq[0], xd[0]), whole)


def edge_shapes(dtype: str):
    """Rows 1..7 (kernels that take rows four at a time meet every short last group) against 1..9
    superblocks, or 1..9 and 17 blocks of 32 (a last step of 1, 2 or 3 blocks, partials left
    untouched by rows of fewer than 8 blocks); and a row of 520 blocks of 32, longer than the NEON
    kernels' stack arrays of activation sums (512 blocks), where they take another path."""
    f = blocks.FORMATS[dtype]
    counts = range(1, 10) if f.values == 256 else [*range(1, 10), 17]
    return [(1 + i % 7, n * f.values) for i, n in enumerate(counts)] + [(2, 520 * 32)]


def extreme_activations(cols: int, kind: str, tokens: int = 1):
    """q8_0 activations made directly: full-scale quants (the largest int32 sums) or random ones,
    with scales from subnormal to very large, and zero."""
    nb = cols // 32
    if kind == "full":
        xq = np.where(rng.random((tokens, cols)) < 0.5, 127, -127).astype(np.int8)
    else:
        xq = rng.integers(-127, 128, (tokens, cols), dtype=np.int8)
    xd = rng.choice(np.array([1e-40, 3e-39, 1e-20, 0.0, 1.0, 7.5e3, 1e15, 2e20], np.float32), (tokens, nb))
    return xq, xd.astype(np.float32)


def check_products(harness, dtype, w, cols, xq, xd):
    """The harness's matvec (token 0) and batched product (every token) against the reference."""
    rows, tokens = w.shape[0], xq.shape[0]
    want = np.stack([blocks.matvec(dtype, w, cols, xq[t], xd[t]) for t in range(tokens)])
    assert np.all(np.isfinite(want))
    payload = w.tobytes() + xq[:1].tobytes() + f32_bytes(xd[:1])
    got = np.frombuffer(run_harness(harness, ["blocks_matvec", dtype, rows, cols], payload), "<f4")
    assert_same_bits(got, want[0])
    payload = w.tobytes() + xq.tobytes() + f32_bytes(xd)
    got = np.frombuffer(run_harness(harness, ["blocks_matmul", dtype, tokens, rows, cols], payload), "<f4")
    assert_same_bits(got, want.reshape(-1))


@pytest.mark.parametrize("dtype", TYPES)
def test_c_products_at_the_kernels_edges(harness, dtype):
    """Every short row group and block count, with edge and large binary16 fields, full-scale and
    random quants, and activation scales from subnormal to 2e20: the NEON, AVX2 and rv32 kernels'
    tails, lane masks and scale decoding against the reference, matvec and batched (3 tokens)."""
    for i, (rows, cols) in enumerate(edge_shapes(dtype)):
        w = random_blocks(dtype, rows * cols // blocks.FORMATS[dtype].values, True, spread=1e3 if i % 2 else 1e-3)
        xq, xd = extreme_activations(cols, "full" if i % 3 == 0 else "random", tokens=3)
        check_products(harness, dtype, w.reshape(rows, -1), cols, xq, xd)


@pytest.mark.parametrize("dtype", TYPES)
def test_c_batched_products_over_several_passes(harness, dtype):
    """More tokens than one pass of a batched kernel takes: 70 tokens of short rows (passes of 64),
    and 10 tokens of rows of 512 blocks of 32 (an affine type's activation sums then fit 8 tokens
    per pass on NEON)."""
    for rows, cols, tokens in ((5, 256, 70), (3, 512 * 32, 10)):
        w = row_blocks(dtype, rows, cols)
        xq, xd = activations(cols, tokens)
        check_products(harness, dtype, w, cols, xq, xd)


@pytest.mark.parametrize("dtype", TYPES)
def test_c_batched_products_of_eight_tokens_and_more_over_row_tiles(harness, dtype):
    """The lanes kernels (eight tokens a vector, a tile of decoded rows shared by every token of a
    pass): Gemma 3 270M's rows of 640 values (20 blocks of 32: a short last group of 4) or two
    superblocks, more rows than a tile (and not a multiple of four), 8, 12 and 40 tokens (a pass of
    32 and one of 8)."""
    f = blocks.FORMATS[dtype]
    cols = 640 if f.values == 32 else 2 * 256
    rows = 16384 // cols + 7
    w = row_blocks(dtype, rows, cols)
    for tokens in (8, 12, 40):
        xq, xd = activations(cols, tokens)
        check_products(harness, dtype, w, cols, xq, xd)


@pytest.mark.parametrize("dtype", TYPES)
def test_c_batched_products_of_many_rows(harness, dtype):
    """More rows than one tile of the batched product holds (and not a multiple of four), several
    tokens: each token's rows are the matvec's bits."""
    f = blocks.FORMATS[dtype]
    cols = 2 * 256
    rows = 16384 // (cols // f.values * f.nbytes) + 5
    tokens = 3
    w = row_blocks(dtype, rows, cols)
    xq, xd = activations(cols, tokens)
    check_batched(harness, dtype, w, rows, cols, xq, xd)


def stress_shapes(dtype: str):
    """Row counts around the SIMD kernels' groups of 8 rows (1, 7, 9, 17) and column counts of 1 to
    9 superblocks (256-value types) or 1 to 17 blocks (32-value types: short groups of 8 too)."""
    f = blocks.FORMATS[dtype]
    counts = range(1, 10) if f.values == 256 else (1, 2, 3, 5, 7, 8, 9, 12, 15, 16, 17)
    rows = (1, 7, 9, 17)
    return [(rows[k % len(rows)], n * f.values) for k, n in enumerate(counts)]


def edge_blocks(dtype: str, rows: int, cols: int) -> np.ndarray:
    """Random quants with every binary16 field drawn from the edge values (zero, subnormal, +-65504,
    negative), so that every lane of every group of eight blocks meets them."""
    w = row_blocks(dtype, rows, cols, edges=False).reshape(-1, blocks.FORMATS[dtype].nbytes)

    def pick(kind, count):
        if kind == "e8m0":
            return rng.choice(np.concatenate([EDGE_EXPONENTS, np.array([121, 122, 128], np.uint8)]), count)
        return rng.choice(np.concatenate([EDGE_HALVES, np.array([0.01, -0.02, 1.0], np.float16)]), count)

    set_scales(dtype, w, pick)
    return w.reshape(rows, -1)


@pytest.mark.parametrize("dtype", TYPES)
def test_c_products_at_every_row_and_block_count_of_the_simd_groups(harness, dtype):
    for rows, cols in stress_shapes(dtype):
        for w in (row_blocks(dtype, rows, cols), edge_blocks(dtype, rows, cols)):
            xq, xd = activations(cols)
            payload = w.tobytes() + xq.tobytes() + f32_bytes(xd)
            got = np.frombuffer(run_harness(harness, ["blocks_matvec", dtype, rows, cols], payload), "<f4")
            assert_same_bits(got, blocks.matvec(dtype, w, cols, xq[0], xd[0]))


@pytest.mark.parametrize("dtype", TYPES)
def test_c_products_at_the_largest_integer_sums(harness, dtype):
    """Every weight byte but the scales 0x00 or 0xFF (the largest unsigned quants, IQ4's -127, MXFP4's -12) against activation
    quants all +127 or all -127: the int16 pair sums of maddubs at their largest (Q6_K 2 * 63 * 127,
    IQ4 2 * 127 * 127) must stay exact."""
    f = blocks.FORMATS[dtype]
    rows, cols = 9, 2 * 256
    for fill in (0x00, 0xFF):
        w = row_blocks(dtype, rows, cols, edges=False).reshape(-1, f.nbytes)
        scale_bytes = [at for at in f.halves for at in (at, at + 1)] + ([0] if dtype == "mxfp4" else [])
        kept = w[:, scale_bytes].copy()
        w[:] = fill
        w[:, scale_bytes] = kept
        w = w.reshape(rows, -1)
        for sign in (1.0, -1.0):
            xq, xd = quantize_q8_0(np.full((1, cols), sign, np.float32))
            assert np.all(np.abs(xq) == 127)
            payload = w.tobytes() + xq.tobytes() + f32_bytes(xd)
            got = np.frombuffer(run_harness(harness, ["blocks_matvec", dtype, rows, cols], payload), "<f4")
            assert_same_bits(got, blocks.matvec(dtype, w, cols, xq[0], xd[0]))


@pytest.mark.parametrize("dtype", TYPES)
def test_c_batched_products_over_many_tokens_and_rows(harness, dtype):
    """Token counts around the batched kernels' groups of 8 and passes of 16 (1, 2, 8, 9, 17) over 19
    rows: each token gets the matvec bits."""
    f = blocks.FORMATS[dtype]
    rows, cols = 19, 3 * 256 if f.values == 256 else 9 * 32
    w = edge_blocks(dtype, rows, cols)
    for tokens in (1, 2, 8, 9, 17):
        xq, xd = activations(cols, tokens)
        check_batched(harness, dtype, w, rows, cols, xq, xd)
