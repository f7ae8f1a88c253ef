"""The rv32 kernel set and the operations it leans on: compiled for rv32imafc and run bare metal
on qemu-system-riscv32 they give the scalar kernels' bits (and cost what docs/performance.md
says); on every kernel set their fast paths (16-row passes, 16-long dot products, exp inside
softmax) match NumPy; and bench counts attention's multiply-accumulates correctly."""

import re
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import REPO, f32_bytes, half_bytes, run_harness, run_rv32_semihosted
from test_numerics import assert_batched_product_is_each_tokens_matvec, assert_same_bits, c_floats, random_halves

from generator import bench
from generator.boards import kernel_set_sources
from generator.numerics import ops as numerics
from generator.numerics.quantize import matvec_q4_1, matvec_q8_0, quantize_q8_0, quantize_weights_q8_0, unpack_q4_1

pytestmark = pytest.mark.slow  # builds the kernels for every ISA and runs them under qemu

rng = np.random.default_rng(32)
RUNTIME = REPO / "firmware_src" / "runtime"


@pytest.fixture(scope="module")
def selftest_output(tmp_path_factory) -> str:
    """tests/c/rv32_selftest.c built for qemu-rv32 (semihosting for its output) and run on the
    emulator; its exit is 0 when nothing differed."""
    sources = [REPO / "tests" / "c" / "rv32_selftest.c", RUNTIME / "ops.c"]
    sources += [RUNTIME / "kernels" / "scalar.c", *kernel_set_sources("rv32")]
    elf = tmp_path_factory.mktemp("rv32") / "selftest.elf"
    return run_rv32_semihosted(sources, elf, RUNTIME, extra=("-lm",))


def test_rv32_kernels_on_the_emulated_cpu_give_the_scalar_kernels_bits(selftest_output):
    assert "mismatches 0" in selftest_output
    assert "differs" not in selftest_output


def test_rv32_q8_0_product_costs_about_three_instructions_per_multiply_accumulate(selftest_output):
    # Exact counts (-icount shift=0): lb, mul and add per multiply-add, plus the block scales: 3.25
    # with float32 scales; binary16 ones cost three instructions more per row and block (lh, slli,
    # and, fmv.w.x for one flw, rv32/matvec.c), ~0.09 per multiply-add, of which the first block's term,
    # no longer added to -0.0f, wins back ~0.03: 3.31-3.32.
    per_mac = {
        m.group(1): float(m.group(2))
        for m in re.finditer(r"matvec_q8_0 (\d+x\d+): \d+ \(([\d.]+) per", selftest_output)
    }
    assert per_mac["512x64"] < 3.35 and per_mac["64x128"] < 3.35
    dot16 = int(re.search(r"op_dot 16: (\d+)", selftest_output).group(1))
    assert dot16 < 90  # 64 for the arithmetic of a 16-long attention dot product


def test_rv32_widens_a_binary16_kv_tile_in_about_six_instructions_a_value(selftest_output):
    # lh, slli, and, fmv.w.x, fmul by 2^112 and fsw (rv32/vector.c), against ~12 for the portable
    # kernel_half_to_float; the bits are checked for all 65,536 encodings above.
    widen = int(re.search(r"widen_f16 512: (\d+)", selftest_output).group(1))
    assert widen < 7 * 512


def test_rv32_reads_a_binary16_kv_tile_in_place_at_about_a_float32_tiles_cost(selftest_output):
    # Four query heads on one KV head, head width 16, 64 positions (the default model's decode):
    # a key decoded once for the four heads (lh, slli, and, fmv.w.x) where the tile cost its
    # widening (6 a value) and then an flw per head; the bits are checked above against the scalar
    # widening. Measured: scores 14,549 (f32 tile 13,674, widened 20,223), value sums 15,687
    # (14,294; 20,843).
    m = re.search(
        r"attention 4x16 64 positions: f16 in place scores (\d+) mix (\d+), f16 widened scores (\d+) mix (\d+), "
        r"f32 scores (\d+) mix (\d+)",
        selftest_output,
    )
    scores, mix, widened_scores, widened_mix, f32_scores, f32_mix = map(int, m.groups())
    assert scores < 0.8 * widened_scores and mix < 0.8 * widened_mix
    assert scores < 1.12 * f32_scores and mix < 1.12 * f32_mix


def test_rv32_q4_1_product_reads_nibbles_in_place_at_about_four_instructions_per_multiply_accumulate(selftest_output):
    # Per byte and row: lbu, andi, two mul and two add for two multiply-adds (rv32/matvec.c), plus each
    # row's float term per block; q4_0 read in place has no rv32 kernel (the scalar one).
    per_mac = {
        (m.group(1), m.group(2)): float(m.group(3))
        for m in re.finditer(r"matvec_(q4_[01]) (\d+x\d+): \d+ \(([\d.]+) per", selftest_output)
    }
    # 4.19-4.37 (rv32/matvec.c): ~3.4 for the nibbles and the activation pairs, then per row and block
    # the widening of the binary16 scale and minimum (8 instructions) and the term's float work;
    # 32x288's nine blocks take the reduction tree's eight partials (kernels.h), each set up alone.
    for shape in ("64x64", "64x128", "512x64", "32x288"):
        assert per_mac["q4_1", shape] < 4.5
        assert per_mac["q4_1", shape] < 0.6 * per_mac["q4_0", shape]


# Every kept GGUF type's rv32 kernel (rv32/kquants.c, rv32/blocks.c), instructions per multiply-accumulate at the
# self-test's shapes (64x256 and 32x1024, 64x64 for the 32-value types, 32x288 for Q5_0): the
# measured values plus a margin, and at most 0.45 of the scalar kernel's (17.4-31.9).
GGUF_RV32_PER_MAC = {
    "q4_k": 6.0,  # 5.81-5.93: a byte's two nibbles, andi / srai, mul, add each
    "q6_k": 9.6,  # 9.35-9.49
    "q5_0": 9.1,  # 8.11-8.97: both 5-bit quants of a byte looked up with its two interleaved qh bits
    "q5_1": 9.5,  # 8.53-9.41: the same, plus the minimum's term
    "q5_k": 8.6,  # 8.31-8.44: the byte and its two qh bits index both quants
    "q3_k": 9.1,  # 8.82-8.96: two quants looked up from a qs nibble and two hmask bits
    "q2_k": 6.6,  # 6.36-6.50: each crumb summed where it lies, one andi
    "iq4_xs": 6.1,  # 5.80-5.99: both table values of a byte from one 512-byte table lookup
    "iq4_nl": 6.5,  # 5.48-6.39
    "mxfp4": 6.3,  # 5.23-6.13
}


def test_rv32_kernels_of_every_kept_gguf_type_cost_under_half_the_scalar_ones(selftest_output):
    found = {
        (m.group(1), m.group(2)): (float(m.group(3)), float(m.group(4)))
        for m in re.finditer(
            r"matvec_(\w+) (\d+x\d+): \d+ \(([\d.]+) per multiply-accumulate\), scalar \d+ \(([\d.]+)\)",
            selftest_output,
        )
    }
    assert {name for name, _ in found} == set(GGUF_RV32_PER_MAC)
    for (name, shape), (fast, scalar) in found.items():
        assert fast < GGUF_RV32_PER_MAC[name], (name, shape, fast)
        assert fast < 0.45 * scalar, (name, shape, fast, scalar)


@pytest.mark.parametrize("rows,cols", [(16, 64), (48, 64), (37, 128), (512, 64), (19, 128), (24, 160)])
def test_q8_0_matvec_at_the_shapes_of_the_16_and_8_row_passes(harness, rows, cols):
    wq, wd = quantize_weights_q8_0(rng.normal(0, 1, (rows, cols)).astype(np.float32))
    xq, xd = quantize_q8_0(rng.normal(0, 1, cols).astype(np.float32))
    payload = wq.tobytes() + half_bytes(wd) + xq.tobytes() + f32_bytes(xd)
    assert_same_bits(c_floats(harness, ["matvec_q8_0", rows, cols], payload, rows), matvec_q8_0(wq, wd, xq, xd))


@pytest.mark.parametrize("tokens,rows,cols", [(3, 240, 64), (2, 37, 128), (5, 16, 64)])
def test_batched_q8_0_product_over_several_row_tiles(harness, tokens, rows, cols):
    wq, wd = quantize_weights_q8_0(rng.normal(0, 1, (rows, cols)).astype(np.float32))
    xq, xd = quantize_q8_0(rng.normal(0, 1, (tokens, cols)).astype(np.float32))
    assert_batched_product_is_each_tokens_matvec(harness, "matmul_q8_0", wq, wq, wd, xq, xd)


# Activation block scales below 2^16, where the rv32 set multiplies w_d * 2^-112 by x_d * 2^112 made once
# per call: subnormal (down to the smallest), zero, ordinary and the largest float32 below 2^16.
PRESCALED_XD = np.array(
    [1e-40, 1.4e-45, 0.0, 3e-3, 1.0, 60000.0, np.nextafter(np.float32(65536), np.float32(0))], np.float32
)


@pytest.mark.parametrize("rows,cols", [(16, 64), (37, 128), (19, 160), (9, 288)])
@pytest.mark.parametrize("large", [False, True])
def test_products_with_binary16_weight_scales_and_extreme_activation_scales(harness, rows, cols, large):
    # Weight scales and minimums anywhere in binary16's range (subnormals, zeros, both signs) times
    # the activation scales above, through the 16-, 8-, 4- and 1-row passes; with `large`, one block
    # of the call at 2^16 or above, which the rv32 set leaves to the scalar kernel.
    nb = cols // 32
    xq = rng.integers(-127, 128, cols).astype(np.int8)
    xd = rng.choice(PRESCALED_XD, nb)
    if large:
        xd[rng.integers(nb)] = rng.choice(np.array([65536.0, 3e5], np.float32))
    wq = rng.integers(-127, 128, (rows, cols)).astype(np.int8)
    wd = random_halves((rows, nb))
    wq[-1] = 0
    wd[-1] = -np.abs(wd[-1])  # isum 0 times negative (or -0.0) scales: terms of -0.0
    payload = wq.tobytes() + half_bytes(wd) + xq.tobytes() + f32_bytes(xd)
    got = c_floats(harness, ["matvec_q8_0", rows, cols], payload, rows)
    assert_same_bits(got, matvec_q8_0(wq, wd, xq, xd))
    packed = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
    d, m = random_halves((rows, nb)), random_halves((rows, nb))
    payload = packed.tobytes() + half_bytes(d, m) + xq.tobytes() + f32_bytes(xd)
    got = c_floats(harness, ["matvec_q4_1", rows, cols], payload, rows)
    assert_same_bits(got, matvec_q4_1(unpack_q4_1(packed), d, m, xq, xd))


@pytest.mark.parametrize("n", [16, 64, 576])
def test_rmsnorm_over_lengths_that_take_the_16_term_dot_product(harness, n):
    x = rng.normal(0, 4, n).astype(np.float32)
    w = rng.normal(1, 0.3, n).astype(np.float32)
    eps = np.float32(1e-6)
    got = c_floats(harness, ["rmsnorm", n, float.hex(float(eps))], f32_bytes(x, w), n)
    assert_same_bits(got, numerics.rmsnorm(x, w, eps))


@pytest.mark.parametrize("n", [1, 16, 73, 300])
def test_softmax_with_scores_far_below_the_maximum(harness, n):
    # Differences below -87 give exactly 0, -inf scores too; the rest go through exp.
    x = rng.uniform(-200, 20, n).astype(np.float32)
    if n > 2:
        x[1] = -np.inf
        x[2] = x[0] - np.float32(87.0)
    assert_same_bits(c_floats(harness, ["softmax", n], f32_bytes(x), n), numerics.softmax(x))


def test_activation_quantization_of_tiny_and_huge_blocks(harness):
    x = rng.normal(0, 1, 128).astype(np.float32)
    x[:32] *= np.float32(1e-37)  # d = max / 127 is subnormal and 1 / d overflows: every quant clamped
    x[32:64] *= np.float32(1e37)
    x[64:96] = np.float32(3.0)  # every value equal to the block maximum
    raw = run_harness(harness, ["quantize", x.size], f32_bytes(x))
    with np.errstate(over="ignore"):
        qs, d = quantize_q8_0(x)
    assert raw[: x.size] == qs.astype(np.int8).tobytes()
    assert_same_bits(np.frombuffer(raw[x.size :], "<f4"), d)


def tiny_plan(windows=()):
    spec = SimpleNamespace(n_layers=4, n_heads=4, head_dim=16, layer_windows=windows)
    return SimpleNamespace(spec=spec)


def test_attention_multiply_accumulates_grow_with_the_context():
    # kjv-tiny: 4 layers x 4 heads x (16 for q . k + 16 for the values) per position seen.
    assert bench.attention_macs(tiny_plan(), 1) == 512
    assert bench.attention_macs(tiny_plan(), 72) == 512 * 72
    # A sliding-window layer sees at most its window.
    assert bench.attention_macs(tiny_plan((0, 4, 0, 4)), 10) == 128 * (10 + 4 + 10 + 4)


def test_bench_averages_attention_over_the_decode_passes():
    # 8-token prompt, 128 steps: 127 passes at positions 8..134, seeing 9..135 positions (mean 72).
    assert bench.decode_attention_macs(tiny_plan(), 8, 128) == 512 * 72
    assert bench.decode_attention_macs(tiny_plan(), 8, 2) == 512 * 9
    assert bench.decode_attention_macs(tiny_plan(), 8, 1) == 0.0
