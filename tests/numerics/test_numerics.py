"""The C runtime's operations return exactly the bits of generator/numerics/ops.py."""

import numpy as np
import pytest
from conftest import f32_bytes, half_bytes, run_harness

from generator.numerics import ops as numerics
from generator.numerics.quantize import (
    dequantize_q4_1,
    dequantize_q8_0,
    matvec_q4_1,
    matvec_q8_0,
    quantize_q4_0,
    quantize_q4_1,
    quantize_q8_0,
    quantize_weights_q8_0,
    unpack_q4_0,
    unpack_q4_1,
)

rng = np.random.default_rng(7)


def c_floats(harness, args, payload, count):
    out = np.frombuffer(run_harness(harness, args, payload), dtype="<f4")
    assert out.size == count
    return out


def assert_same_bits(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert a.shape == b.shape
    mismatch = np.nonzero(a.view(np.uint32) != b.view(np.uint32))[0]
    assert mismatch.size == 0, f"first mismatch at {mismatch[0]}: {a.flat[mismatch[0]]!r} vs {b.flat[mismatch[0]]!r}"


def assert_batched_product_is_each_tokens_matvec(harness, op, stored, wq, wd, xq, xd):
    """The harness's batched product `op` of the weights (as it reads them: `stored`, their scales
    `wd`) and the q8_0 tokens `xq`, `xd` gives each token the bits of matvec_q8_0 on the weights'
    quants `wq`."""
    (rows, cols), tokens = wq.shape, len(xq)
    payload = stored.tobytes() + half_bytes(wd) + xq.tobytes() + f32_bytes(xd)
    got = c_floats(harness, [op, tokens, rows, cols], payload, tokens * rows).reshape(tokens, rows)
    for t in range(tokens):
        assert_same_bits(got[t], matvec_q8_0(wq, wd, xq[t], xd[t]))


def test_expf_matches_bit_for_bit_over_its_whole_range(harness):
    x = np.concatenate(
        [
            np.linspace(-100, 100, 20001, dtype=np.float32),
            rng.normal(0, 10, 5000).astype(np.float32),
            np.array([-87.0, -86.99999, 88.0, 88.5, 0.0, -0.0, 1e-30], np.float32),
        ]
    )
    assert_same_bits(c_floats(harness, ["expf", x.size], f32_bytes(x), x.size), numerics.expf(x))


def test_expf_is_accurate_to_a_few_ulp():
    x = np.linspace(-80, 80, 100001, dtype=np.float32)
    ours = numerics.expf(x).astype(np.float64)
    exact = np.exp(x.astype(np.float64))
    assert np.max(np.abs(ours - exact) / exact) < 4e-7
    assert numerics.expf(np.float32(-100.0)) == 0.0


def test_tanh_and_gelu_match_and_are_accurate(harness):
    x = np.concatenate([np.linspace(-20, 20, 8001, dtype=np.float32), rng.normal(0, 2, 2000).astype(np.float32)])
    assert_same_bits(c_floats(harness, ["tanh", x.size], f32_bytes(x), x.size), numerics.tanh(x))
    assert_same_bits(c_floats(harness, ["gelu", x.size], f32_bytes(x), x.size), numerics.gelu_tanh(x))
    assert np.max(np.abs(numerics.tanh(x) - np.tanh(x.astype(np.float64)))) < 2e-7
    import math

    exact = np.array(
        [0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))) for v in x.astype(float)]
    )
    assert np.max(np.abs(numerics.gelu_tanh(x) - exact) / np.maximum(1.0, np.abs(exact))) < 1e-6


def test_gpt_oss_clamped_swiglu_matches_and_clamps(harness):
    """op_swiglu_clamped: min(gate, limit), clamp(up, -limit, limit), (up + 1) * (gate * sigmoid(alpha
    gate)); values past the limits on both sides, at them and just inside, signed zeros."""
    alpha, limit = np.float32(1.702), np.float32(7.0)
    edges = np.array([7.0, -7.0, 7.5, -7.5, 100.0, -100.0, 0.0, -0.0, 6.999999, -7.000001], np.float32)
    gate = np.concatenate([rng.normal(0, 5, 600).astype(np.float32), edges, np.roll(edges, 3)])
    up = np.concatenate([rng.normal(0, 5, 600).astype(np.float32), np.roll(edges, 5), edges])
    args = ["swiglu_clamped", gate.size, float.hex(float(alpha)), float.hex(float(limit))]
    want = numerics.swiglu_clamped(gate, up, alpha, limit)
    assert_same_bits(c_floats(harness, args, f32_bytes(gate, up), gate.size), want)
    # The clamps as stated: a gate above the limit counts as the limit, an up beyond it likewise.
    assert numerics.swiglu_clamped(np.float32(50), np.float32(-50), alpha, limit) == numerics.swiglu_clamped(
        limit, -limit, alpha, limit
    )
    g = np.float32(1.5)
    assert numerics.swiglu_clamped(g, np.float32(0.0), alpha, limit) == g * numerics.sigmoid(alpha * g)


@pytest.mark.parametrize("sink", [0.0, 3.5, -2.0, 40.0, -100.0])
def test_softmax_with_a_sink_matches_and_leaves_the_sinks_share_out(harness, sink):
    x = rng.normal(0, 4, 37).astype(np.float32)
    sink = np.float32(sink)
    got = c_floats(harness, ["softmax_sink", x.size, float.hex(float(sink))], f32_bytes(x), x.size)
    want = numerics.softmax_with_sink(x, sink)
    assert_same_bits(got, want)
    e = np.exp(np.append(x, sink).astype(np.float64) - max(x.max(), sink))
    exact, sink_share = e[:-1] / e.sum(), e[-1] / e.sum()
    assert np.max(np.abs(want - exact)) < 1e-6
    assert abs(float(numerics.seq_sum(want)) - (1.0 - sink_share)) < 1e-5  # the sink's share is dropped


def test_silu_softmax_rmsnorm_match(harness):
    x = rng.normal(0, 4, 777).astype(np.float32)
    assert_same_bits(c_floats(harness, ["silu", x.size], f32_bytes(x), x.size), numerics.silu(x))
    assert_same_bits(c_floats(harness, ["softmax", x.size], f32_bytes(x), x.size), numerics.softmax(x))
    w = rng.normal(1, 0.3, x.size).astype(np.float32)
    eps = np.float32(1e-5)
    got = c_floats(harness, ["rmsnorm", x.size, float.hex(float(eps))], f32_bytes(x, w), x.size)
    assert_same_bits(got, numerics.rmsnorm(x, w, eps))
    # Gemma 4's values: the same norm without a weight, rmsnorm's bits with w = 1.
    got = c_floats(harness, ["rmsnorm_unscaled", x.size, float.hex(float(eps))], f32_bytes(x), x.size)
    assert_same_bits(got, numerics.rmsnorm_unscaled(x, eps))
    assert_same_bits(got, numerics.rmsnorm(x, np.ones_like(x), eps))


@pytest.mark.parametrize("n", [1, 7, 8, 9, 64, 1537])
def test_attention_softmax_kernel_is_op_softmax(harness, n):
    """kernel_softmax (what attention runs; AVX2 vectorizes its exponentials and divisions) gives
    op_softmax's bits: rows around the vector width, scores far below the maximum (exp below -87
    is 0), equal maxima."""
    x = rng.normal(0, 30, n).astype(np.float32)
    x[:: max(1, n // 5)] = np.float32(-200.0)
    x[n // 2] = x.max() if n > 2 else x[n // 2]
    got = c_floats(harness, ["kernel_softmax", n], f32_bytes(x), n)
    assert_same_bits(got, numerics.softmax(x))
    assert_same_bits(got, c_floats(harness, ["softmax", n], f32_bytes(x), n))


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 9])
@pytest.mark.parametrize("n", [1, 7, 8, 17, 1537])
def test_softmax_of_a_kv_heads_query_heads_together_is_op_softmax_row_by_row(harness, rows, n):
    """kernel_softmax_rows (attention's: the sums of a group's rows interleaved, the maximum eight
    lanes at a time) gives each row op_softmax's bits, and leaves what lies between the rows: rows
    whose maximum is a zero of either sign, a NaN first or further on, exp below -87."""
    stride = n + 3
    x = rng.normal(0, 30, (rows, stride)).astype(np.float32)
    x[:, :: max(1, n // 5)] = np.float32(-200.0)
    if rows > 1:
        x[1, :n] = -np.abs(x[1, :n])
        x[1, n // 2] = np.float32(-0.0)
        x[1, n - 1] = np.float32(0.0)
    if rows > 2:
        x[2, n // 2] = np.float32("nan")
    if rows > 3:
        x[3, 0] = np.float32("nan")
    got = c_floats(harness, ["kernel_softmax_rows", n, rows, stride], f32_bytes(x), rows * stride).reshape(rows, stride)
    for r in range(rows):
        assert_same_bits(got[r, :n], numerics.softmax(x[r, :n]))
        assert_same_bits(got[r, n:], x[r, n:])


def test_log_and_softplus_match_and_are_accurate(harness):
    x = np.concatenate(
        [np.geomspace(1e-30, 1e30, 4001, dtype=np.float32), np.array([1.0, 2.0, 1.4142135, 1.4142137], np.float32)]
    )
    assert_same_bits(c_floats(harness, ["log", x.size], f32_bytes(x), x.size), numerics.log(x))
    assert np.max(np.abs(numerics.log(x) - np.log(x.astype(np.float64))) / np.maximum(1.0, np.abs(np.log(x)))) < 3e-7
    y = np.concatenate([np.linspace(-100, 100, 8001, dtype=np.float32), np.array([20.0, 20.000002, -0.0], np.float32)])
    assert_same_bits(c_floats(harness, ["softplus", y.size], f32_bytes(y), y.size), numerics.softplus(y))
    exact = np.logaddexp(0.0, y.astype(np.float64))
    assert np.max(np.abs(numerics.softplus(y) - exact) / np.maximum(exact, 1e-30)) < 1e-6


@pytest.mark.parametrize("value_dim", [24, 32])
def test_gated_deltanet_steps_match(harness, value_dim):
    """The DeltaNet's l2 norm, convolution step, delta-rule step (every kernel set's: columns eight
    or four per vector where value_dim allows, the scalar loop otherwise) and gated RMSNorm."""
    x = rng.normal(0, 2, 48).astype(np.float32)
    assert_same_bits(c_floats(harness, ["l2norm", x.size], f32_bytes(x), x.size), numerics.l2norm(x))
    channels, kernel = 40, 4
    state = rng.normal(0, 1, (kernel - 1, channels)).astype(np.float32)
    taps = rng.normal(0, 0.5, (channels, kernel)).astype(np.float32)
    got = c_floats(harness, ["conv_step", channels, kernel], f32_bytes(state, taps, x[:channels]), channels * kernel)
    out, new_state = numerics.conv_step(state, x[:channels], taps)
    assert_same_bits(got[:channels], out)
    assert_same_bits(got[channels:].reshape(kernel - 1, channels), new_state)
    key_dim = 16
    s = rng.normal(0, 1, (key_dim, value_dim)).astype(np.float32)
    q, k = (numerics.l2norm(rng.normal(0, 1, key_dim).astype(np.float32)) for _ in range(2))
    v = rng.normal(0, 1, value_dim).astype(np.float32)
    gates = np.array([0.93, 0.41], np.float32)
    got = c_floats(
        harness, ["delta_step", key_dim, value_dim], f32_bytes(s, q, k, v, gates), value_dim + key_dim * value_dim
    )
    out, new_s = numerics.delta_rule_step(s, q, k, v, gates[0], gates[1])
    assert_same_bits(got[:value_dim], out)
    assert_same_bits(got[value_dim:].reshape(key_dim, value_dim), new_s)
    w, z = rng.normal(1, 0.3, value_dim).astype(np.float32), rng.normal(0, 2, value_dim).astype(np.float32)
    eps = np.float32(1e-6)
    got = c_floats(harness, ["gated_rmsnorm", value_dim, float.hex(float(eps))], f32_bytes(v, w, z), value_dim)
    assert_same_bits(got, numerics.gated_rmsnorm(v, w, z, eps))


@pytest.mark.parametrize("n", [32, 96, 4096])
def test_activation_quantization_matches(harness, n):
    x = (rng.normal(0, 3, n) * rng.choice([0.0, 1.0, 1e-3, 100.0], n)).astype(np.float32)
    x[:32] = 0.0  # an all-zero block has scale 0
    raw = run_harness(harness, ["quantize", n], f32_bytes(x))
    qs, d = quantize_q8_0(x)
    assert raw[:n] == qs.astype(np.int8).tobytes()
    assert_same_bits(np.frombuffer(raw[n:], "<f4"), d)


@pytest.mark.parametrize(
    "rows,cols", [(1, 32), (7, 64), (250, 96), (33, 1536), (5, 256), (3, 288), (9, 576), (2, 32 * 17)]
)
def test_q8_0_matvec_matches(harness, rows, cols):
    wq, wd = quantize_weights_q8_0(rng.normal(0, 1, (rows, cols)).astype(np.float32))
    xq, xd = quantize_q8_0(rng.normal(0, 1, cols).astype(np.float32))
    payload = wq.tobytes() + half_bytes(wd) + xq.tobytes() + f32_bytes(xd)
    got = c_floats(harness, ["matvec_q8_0", rows, cols], payload, rows)
    assert_same_bits(got, matvec_q8_0(wq, wd, xq, xd))


@pytest.mark.parametrize(
    "tokens,rows,cols",
    [
        (1, 9, 64),
        (2, 1, 32),
        (3, 11, 32 * 13),
        (4, 8, 576),
        (5, 17, 256),
        (6, 9, 32 * 9),
        (7, 13, 96),
        (8, 8, 576),
        (9, 5, 288),
        (17, 33, 1536),
        (64, 3, 32 * 17),
    ],
)
def test_batched_q8_0_product_gives_each_token_the_matvec_bits(harness, tokens, rows, cols):
    wq, wd = quantize_weights_q8_0(rng.normal(0, 1, (rows, cols)).astype(np.float32))
    xq, xd = quantize_q8_0(
        (rng.normal(0, 1, (tokens, cols)) * rng.choice([1e-3, 1.0, 50.0], (tokens, 1))).astype(np.float32)
    )
    assert_batched_product_is_each_tokens_matvec(harness, "matmul_q8_0", wq, wq, wd, xq, xd)


def test_q4_0_quants_span_minus_8_to_7_and_reconstruct_within_half_a_step_except_at_the_clipped_end():
    # its own generator: the module's stream depends on which tests ran before on this worker
    own = np.random.default_rng(40256)
    x = (own.normal(0, 1, (40, 256)) * own.choice([1e-4, 1.0, 30.0], (40, 1))).astype(np.float32)
    x[0, :32] = 0.0
    x[1, :32] = np.linspace(-1, 3, 32)  # the largest magnitude positive: it maps to quant 0 (-8)
    packed, d = quantize_q4_0(x)
    assert packed.shape == (40, 128) and packed.dtype == np.uint8 and d.shape == (40, 8)
    q = unpack_q4_0(packed)
    assert q.min() >= -8 and q.max() <= 7
    assert q[1, 31] == -8 and d[1, 0] == np.float32(3.0) / np.float32(-8.0)
    assert d.dtype == np.float16  # the image's binary16 scales
    err = np.abs(dequantize_q8_0(q, d) - x).reshape(40, 8, 32)
    # a step of d, widened by d's rounding to binary16 (relative 2^-11; 2^-25 for subnormals)
    step = (np.abs(d.astype(np.float32)) * (1 + 2.0**-10) + 2.0**-24)[..., None]
    clipped = q.reshape(40, 8, 32) == 7  # +8 steps would be needed on the side opposite m
    assert np.all(err[~clipped] <= (step * 0.5 + 1e-30).repeat(32, -1)[~clipped])
    assert np.all(err <= step)
    assert not np.any(dequantize_q8_0(q, d)[0, :32])


@pytest.mark.parametrize("rows,cols", [(1, 32), (7, 64), (250, 96), (33, 1536), (9, 576), (2, 32 * 17)])
def test_q4_0_matvec_is_the_q8_0_product_of_its_int8_values(harness, rows, cols):
    packed, wd = quantize_q4_0(rng.normal(0, 1, (rows, cols)).astype(np.float32))
    xq, xd = quantize_q8_0(rng.normal(0, 1, cols).astype(np.float32))
    payload = packed.tobytes() + half_bytes(wd) + xq.tobytes() + f32_bytes(xd)
    got = c_floats(harness, ["matvec_q4_0", rows, cols], payload, rows)
    assert_same_bits(got, matvec_q8_0(unpack_q4_0(packed), wd, xq, xd))


@pytest.mark.parametrize(
    "tokens,rows,cols", [(2, 9, 64), (3, 11, 32 * 13), (5, 17, 576), (7, 8, 32 * 9), (9, 5, 288), (17, 3, 1536)]
)
def test_batched_q4_0_product_gives_each_token_the_matvec_bits(harness, tokens, rows, cols):
    packed, wd = quantize_q4_0(rng.normal(0, 1, (rows, cols)).astype(np.float32))
    xq, xd = quantize_q8_0(rng.normal(0, 1, (tokens, cols)).astype(np.float32))
    assert_batched_product_is_each_tokens_matvec(harness, "matmul_q4_0", packed, unpack_q4_0(packed), wd, xq, xd)


def test_q4_1_quants_span_min_to_max_and_reconstruct_within_half_a_step():
    x = (rng.normal(0, 1, (40, 256)) * rng.choice([1e-4, 1.0, 30.0], (40, 1))).astype(np.float32)
    x[0, :32] = 0.0  # a constant block: d = 0, every value is m
    x[0, 32:64] = -2.5
    x[1, :32] = np.linspace(-7, -3, 32)  # all negative: m < 0, and it is the first value
    x[2, :32] = rng.normal(0, 1e-39, 32).astype(np.float32)  # a span binary16 cannot hold: d = 0
    packed, d, m = quantize_q4_1(x)
    assert packed.shape == (40, 128) and packed.dtype == np.uint8 and d.shape == m.shape == (40, 8)
    q = unpack_q4_1(packed)
    assert q.min() == 0 and q.max() == 15
    assert d[0, 0] == 0 and m[0, 0] == 0 and d[0, 1] == 0 and m[0, 1] == np.float32(-2.5) and d[2, 0] == 0
    assert m[1, 0] == np.float32(-7.0) and q[1, 0] == 0 and q[1, 31] == 15
    low = x.reshape(40, 8, 32).min(axis=-1)
    # m is the minimum rounded down to binary16: at or below it, within one binary16 step
    assert np.all(m.astype(np.float32) <= low)
    assert np.all(np.nextafter(m, np.float16(np.inf)).astype(np.float32) > low)
    back = dequantize_q4_1(q, d, m)
    assert np.all(back[0, :64] == x[0, :64]) and np.all(back[2, :32] == m[2, 0])
    err = np.abs(back - x).reshape(40, 8, 32)
    # half a step, the rounding of d and m to binary16 (relative 2^-11, or 2^-25 for subnormals;
    # 15 steps of d's), and the float32 rounding of (x - m) * (1/d), q * d and + m on top of it
    d32, m32 = d.astype(np.float32), m.astype(np.float32)
    slack = (
        np.abs(d32) * (0.5 + 15 * 2.0**-10)
        + 16 * 2.0**-25
        + np.abs(m32) * 2.0**-10
        + (np.abs(m32) + np.abs(x).reshape(40, 8, 32).max(-1)) * 2e-7
    )[..., None]
    assert np.all(err[:, :, :] <= slack + 1e-30)


def random_q4_1(rows, cols, extreme=False):
    """Any quants, scales and minimums (not only what quantize_q4_1 makes): negative minimums, and
    with `extreme` scales and minimums across binary16's range (subnormals too) and quants at both
    ends."""
    nb = cols // 32
    packed = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
    if extreme:
        packed[::2] = rng.choice(np.array([0x00, 0xFF, 0x0F, 0xF0], np.uint8), packed[::2].shape)
        d = (rng.choice([6e-8, 1e-3, 1.0, 6e4], (rows, nb)) * rng.uniform(0.5, 1, (rows, nb))).astype(np.float16)
        m = (rng.choice([-6e4, -1.0, 0.0, -0.0, 6e-8, 3.0, 6e4], (rows, nb))).astype(np.float16)
    else:
        d = rng.uniform(0, 0.2, (rows, nb)).astype(np.float16)
        m = rng.normal(-1, 1, (rows, nb)).astype(np.float16)
    return packed, d, m


def random_activations(tokens, cols, extreme=False):
    if not extreme:
        return quantize_q8_0(rng.normal(0, 1, (tokens, cols)).astype(np.float32))
    xq = rng.choice(np.array([-127, 127, 0, -1], np.int8), (tokens, cols))
    xd = rng.choice([1e-20, 1e-2, 1e10], (tokens, cols // 32)).astype(np.float32)
    return xq, xd


def q4_1_payload(packed, d, m, xq, xd):
    return packed.tobytes() + half_bytes(d, m) + np.asarray(xq, np.int8).tobytes() + f32_bytes(xd)


@pytest.mark.parametrize(
    "rows,cols", [(1, 32), (7, 64), (250, 96), (33, 1536), (9, 576), (2, 32 * 17), (13, 32 * 9), (17, 32 * 513)]
)
@pytest.mark.parametrize("extreme", [False, True])
def test_q4_1_matvec_matches_numpy_on_every_kernel_set(harness, rows, cols, extreme):
    packed, d, m = random_q4_1(rows, cols, extreme)
    xq, xd = random_activations(1, cols, extreme)
    want = matvec_q4_1(unpack_q4_1(packed), d, m, xq[0], xd[0])
    payload = q4_1_payload(packed, d, m, xq[0], xd[0])
    assert_same_bits(c_floats(harness, ["matvec_q4_1", rows, cols], payload, rows), want)
    # and the scalar reference kernel itself, which every kernel set is held to
    assert_same_bits(c_floats(harness, ["scalar_matvec_q4_1", rows, cols], payload, rows), want)


@pytest.mark.parametrize(
    "tokens,rows,cols",
    [
        (2, 9, 64),
        (4, 11, 32 * 13),
        (5, 17, 576),
        (6, 9, 32 * 9),
        (7, 8, 1536),
        (9, 5, 288),
        (17, 33, 1536),
        (8, 8, 576),
        (3, 40, 32),
    ],
)
def test_batched_q4_1_product_gives_each_token_the_matvec_bits(harness, tokens, rows, cols):
    packed, d, m = random_q4_1(rows, cols, extreme=tokens == 3)
    xq, xd = random_activations(tokens, cols, extreme=tokens == 3)
    got = c_floats(
        harness, ["matmul_q4_1", tokens, rows, cols], q4_1_payload(packed, d, m, xq, xd), tokens * rows
    ).reshape(tokens, rows)
    for t in range(tokens):
        assert_same_bits(got[t], matvec_q4_1(unpack_q4_1(packed), d, m, xq[t], xd[t]))


def test_q4_1_product_is_the_dot_product_of_its_dequantized_weights_to_float32_accuracy():
    w = rng.normal(0, 1, (16, 256)).astype(np.float32)
    packed, d, m = quantize_q4_1(w)
    xq, xd = quantize_q8_0(rng.normal(0, 1, 256).astype(np.float32))
    exact = dequantize_q4_1(unpack_q4_1(packed), d, m).astype(np.float64) @ dequantize_q8_0(xq, xd).astype(np.float64)
    assert np.allclose(matvec_q4_1(unpack_q4_1(packed), d, m, xq, xd), exact, rtol=1e-4, atol=1e-4)


# The SIMD f32 kernels put one row per vector lane (8 on AVX2, 4 on NEON) and work in groups of
# rows and in column blocks of 8 or 4: these shapes cover partial row groups (1, 3, 7, 9, 17, 33
# rows), partial column blocks (1, 5, 31, 100 columns), rows shorter than one block, and long rows.
F32_MATVEC_SHAPES = [
    (1, 1),
    (5, 17),
    (64, 96),
    (3, 1000),
    (1, 5),
    (3, 31),
    (7, 8),
    (8, 8),
    (9, 100),
    (16, 4),
    (17, 33),
    (33, 64),
    (15, 7),
    (31, 576),
    (48, 1536),
    (2, 4099),
    (40, 3),
]
F32_MATMUL_SHAPES = [
    (1, 5, 17),
    (3, 64, 96),
    (10, 3, 1000),
    (2, 1, 1),
    (2, 17, 31),
    (5, 33, 100),
    (9, 16, 8),
    (4, 7, 576),
    (3, 40, 1536),
    (65, 9, 40),
    (7, 3, 4),
]


@pytest.mark.parametrize("tokens,rows,cols", F32_MATMUL_SHAPES)
def test_batched_f32_product_gives_each_token_the_matvec_bits(harness, tokens, rows, cols):
    w = rng.normal(0, 1, (rows, cols)).astype(np.float32)
    x = rng.normal(0, 1, (tokens, cols)).astype(np.float32)
    got = c_floats(harness, ["matmul_f32", tokens, rows, cols], f32_bytes(w, x), tokens * rows).reshape(tokens, rows)
    for t in range(tokens):
        assert_same_bits(got[t], numerics.matvec_f32(w, x[t]))


@pytest.mark.parametrize("rows,cols", F32_MATVEC_SHAPES)
def test_f32_matvec_matches(harness, rows, cols):
    w = rng.normal(0, 1, (rows, cols)).astype(np.float32)
    x = rng.normal(0, 1, cols).astype(np.float32)
    got = c_floats(harness, ["matvec_f32", rows, cols], f32_bytes(w, x), rows)
    assert_same_bits(got, numerics.matvec_f32(w, x))


def special_rows(rows, cols, x):
    """Random weights with rows that make the sum's order and its first term visible in the bits:
    all products -0.0 (a sum started from +0.0 would end +0.0), one NaN, one infinity, products
    that underflow to subnormals or whose sum does, and rows cancelling to 0 then continuing. The
    only NaN is a quiet one in the weights (a NaN made by inf - inf or 0 * inf has a different sign
    on x86 and on aarch64). Special rows sit in several lanes of the first and the last row group."""
    w = rng.normal(0, 1, (rows, cols)).astype(np.float32)
    sign = np.where(np.signbit(x), 1.0, -1.0).astype(np.float32)
    for r in range(0, rows, 5):
        kind = (r // 5) % 6
        if kind == 0:
            w[r] = np.float32(0.0) * sign  # -0.0 * |x| or +0.0 * -|x|: every product -0.0
        elif kind == 1:
            w[r, (r * 7) % cols] = np.nan
        elif kind == 2:
            w[r, (r * 3) % cols] = np.inf if x[(r * 3) % cols] != 0 else 1.0
        elif kind == 3:
            w[r] = rng.normal(0, 1e-39, cols).astype(np.float32)  # subnormal weights
        elif kind == 4:
            w[r] = (rng.normal(0, 1, cols) * 1e-38).astype(np.float32)  # products below the normal range
        else:
            w[r, : cols // 2] = np.float32(1e30)
            w[r, cols // 2 : 2 * (cols // 2)] = np.float32(-1e30)
    return w


@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 5), (19, 37), (40, 100)])
def test_f32_products_keep_signed_zeros_nan_inf_and_subnormals(harness, rows, cols):
    tokens = 3
    x = rng.normal(0, 1, (tokens, cols)).astype(np.float32)
    x[:, ::4] = np.float32(-0.0)
    x[:, 1::6] *= np.float32(1e-20)
    # Tokens 1 and 2: x * 2 and -x, exactly, so that the special rows stay special (no 0 * inf).
    x[1] = x[0] * np.float32(2.0)
    x[2] = -x[0]
    w = special_rows(rows, cols, x[0])
    with np.errstate(all="ignore"):
        want = [numerics.matvec_f32(w, x[t]) for t in range(tokens)]
    got = c_floats(harness, ["matvec_f32", rows, cols], f32_bytes(w, x[0]), rows)
    assert_same_bits(got, want[0])
    got = c_floats(harness, ["matmul_f32", tokens, rows, cols], f32_bytes(w, x), tokens * rows).reshape(tokens, rows)
    for t in range(tokens):
        assert_same_bits(got[t], want[t])


@pytest.mark.parametrize("n", [1, 7, 8, 9, 1536, 4099])
def test_swiglu_kernel_matches_silu_times_up(harness, n):
    specials = np.array([-87.0, -86.9, 87.0, 88.0, 88.5, -0.0, 0.0, np.inf, -np.inf, np.nan])
    gate = np.concatenate([rng.normal(0, 4, n), np.linspace(-100, 100, n), specials]).astype(np.float32)
    gate = np.roll(gate, n % 7)  # the special values land in vector lanes and in the scalar tail
    up = rng.normal(0, 2, gate.size).astype(np.float32)
    got = c_floats(harness, ["swiglu", gate.size], f32_bytes(gate, up), gate.size)
    assert_same_bits(got, numerics.silu(gate) * up)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 2048, 4099])
def test_gelu_tanh_kernel_matches_gelu_times_up(harness, n):
    """Gemma's GeGLU through the kernel set (eight lanes at a time on AVX2) against the NumPy
    reference's gelu_tanh times up, including the exponential's edges and non-finite gates."""
    specials = np.array([-44.0, -43.4, -43.6, 44.0, 44.5, -0.0, 0.0, 1e-30, np.inf, -np.inf, np.nan])
    gate = np.concatenate([rng.normal(0, 4, n), np.linspace(-60, 60, n), specials]).astype(np.float32)
    gate = np.roll(gate, n % 7)  # the special values land in vector lanes and in the scalar tail
    up = rng.normal(0, 2, gate.size).astype(np.float32)
    got = c_floats(harness, ["gelu_mul", gate.size], f32_bytes(gate, up), gate.size)
    want = numerics.gelu_tanh(gate) * up
    # gelu(-inf) is (-inf * 0.5) * (1 + -1): a NaN the operation makes, whose sign is the ISA's
    # default NaN's (x86 negative, Arm positive), op_gelu_tanh's as much as the kernel's.
    made_nan = np.isneginf(gate)
    assert np.isnan(got[made_nan]).all() and np.isnan(want[made_nan]).all()
    assert_same_bits(got[~made_nan], want[~made_nan])


def test_round_even_ties_to_even():
    v = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 126.5, 0.49999997], np.float32)
    assert list(numerics.round_even(v)) == [0.0, 2.0, 2.0, -0.0, -2.0, 126.0, 0.0]


@pytest.mark.parametrize(
    "n,n_q,stride,head_dim",
    [
        (1, 1, 16, 16),
        (7, 3, 32, 16),
        (8, 4, 64, 32),
        (13, 2, 96, 48),
        (5, 5, 64, 64),
        (21, 1, 256, 128),
        (9, 3, 24, 24),
        (3, 2, 300, 300),
        # groups of eight positions (the AVX2 scores) with a tail, more query heads than one pass takes
        (43, 6, 64, 64),
        (64, 9, 192, 64),
        (24, 8, 136, 128),
        (17, 3, 20, 20),
        # sixteen positions a step with their columns staged, then eight, then the scalar tail; and
        # a head wider than the staged columns hold
        (45, 3, 72, 64),
        (33, 2, 264, 264),
    ],
)
def test_attention_tile_scores_and_mix_keep_each_sum_in_order(harness, n, n_q, stride, head_dim):
    """Each score is q_a . k_i summed over j in order, for every query head a of the group; each
    mixed value continues the sum it is given with p_a,i v_i over the positions in order: every
    kernel set, every head size (the sizes the fallback specialises, one it does not, and one past
    its local arrays)."""
    keys = rng.normal(0, 1, (n, stride)).astype(np.float32)
    values = rng.normal(0, 1, (n, stride)).astype(np.float32)
    q = rng.normal(0, 1, (n_q, head_dim)).astype(np.float32)
    p = np.stack([numerics.softmax(row) for row in rng.normal(0, 2, (n_q, n)).astype(np.float32)])
    carried = rng.normal(0, 1, (n_q, head_dim)).astype(np.float32)  # the sum of an earlier tile
    carried[0] = -0.0  # a sum's start
    scale = np.float32(1 / np.sqrt(head_dim))
    raw = run_harness(
        harness,
        ["attention", n, n_q, stride, head_dim, float.hex(float(scale))],
        f32_bytes(keys, values, q, p, carried),
    )
    got = np.frombuffer(raw, "<f4")
    assert got.size == n_q * (n + head_dim)
    want_scores = numerics.dot(keys[None, :, :head_dim], q[:, None, :], axis=2) * scale
    terms = np.concatenate([carried[:, None, :], p[:, :, None] * values[None, :, :head_dim]], axis=1)
    want_mix = numerics.seq_sum(terms, axis=1)
    assert_same_bits(got[: n_q * n], want_scores.reshape(-1))
    assert_same_bits(got[n_q * n :], want_mix.reshape(-1))


@pytest.mark.parametrize(
    "n,n_q,stride,head_dim,ranges",
    [
        # a whole tile of 64 for every token, three heads (SmolLM2's group): 16 positions a pass
        (64, 3, 64, 64, [(0, 64)] * 4),
        # a prompt block on the diagonal: each token sees one more position than the one before
        (64, 3, 192, 64, [(0, c) for c in range(49, 65)]),
        # sliding windows: later first positions, counts that leave 1-7 and 8-15 positions over
        (40, 4, 48, 48, [(3, 37), (9, 31), (17, 9), (39, 1)]),
        (37, 2, 32, 32, [(0, 37), (5, 32), (1, 35)]),  # two heads: 32 positions a pass
        (64, 9, 128, 128, [(0, 64), (63, 1)]),  # more heads than one pass takes
        (13, 1, 24, 24, [(0, 13), (2, 11)]),  # a head width that is not a multiple of eight
        (64, 3, 64, 64, [(0, 64)]),  # one token: the per-token kernel
    ],
)
def test_a_block_of_query_tokens_scores_a_tile_as_each_token_alone(harness, n, n_q, stride, head_dim, ranges):
    """kernel_attention_scores_tokens gives every token of a prompt block the scores it would get
    alone, q_a . k_i summed over j in order, whatever the set does with the tile (AVX2 transposes it
    once for the block), and writes nothing outside each token's positions."""
    keys = rng.normal(0, 1, (n, stride)).astype(np.float32)
    keys[1, :2] = [np.float32(-0.0), np.float32(3e-39)]  # a signed zero, a subnormal
    q = rng.normal(0, 1, (len(ranges), n_q, head_dim)).astype(np.float32)
    scale = np.float32(1 / np.sqrt(head_dim))
    raw = run_harness(
        harness,
        ["attention_tokens", n, n_q, stride, head_dim, float.hex(float(scale)), len(ranges)],
        f32_bytes(keys) + np.array(ranges, "<i4").tobytes() + f32_bytes(q),
    )
    got = np.frombuffer(raw, "<f4").reshape(len(ranges), n_q, n)
    for t, (first, count) in enumerate(ranges):
        seen = keys[first : first + count, :head_dim]
        want = numerics.dot(seen[None, :, :], q[t][:, None, :], axis=2) * scale
        assert_same_bits(got[t][:, first : first + count].reshape(-1), want.reshape(-1))
        outside = np.concatenate([got[t][:, :first], got[t][:, first + count :]], axis=1)
        assert np.all(outside == np.float32(-7.0)), f"token {t} wrote outside its positions"


@pytest.mark.parametrize(
    "n,n_q,stride,head_dim,tile_rows,large",
    [
        (72, 4, 16, 16, 64, False),  # the default model's group: four heads, four positions at a time
        (7, 4, 24, 16, 3, True),  # a query of 2^16: the widened path
        (9, 2, 32, 32, 4, False),  # two heads: one at a time
        (13, 6, 64, 64, 64, False),  # four heads and then two
        (5, 4, 12, 12, 2, False),  # a head width rv32 does not take in place
        (3, 1, 256, 256, 2, False),
        (45, 3, 64, 64, 64, False),  # SmolLM2's group: staged steps of sixteen positions, eight, a tail
    ],
)
def test_attention_over_a_binary16_tile_read_in_place_is_the_widened_tiles(
    harness, n, n_q, stride, head_dim, tile_rows, large
):
    """kernel_attention_*_f16 give the float kernels' bits on the keys and values widened to
    float32: every kernel set (rv32 decodes them in registers, the others widen tile_rows rows at a
    time, a value sum carried from one tile to the next)."""
    keys = rng.normal(0, 1, (n, stride)).astype(np.float16)
    values = rng.normal(0, 1, (n, stride)).astype(np.float16)
    keys[0, :3] = [np.float16(6e-8), np.float16(-0.0), np.float16(65504)]  # subnormal, zero, largest
    q = rng.normal(0, 1, (n_q, head_dim)).astype(np.float32)
    q[0, 0] = np.float32(2.0**16 if large else 2.0**16 - 1)
    q[-1, 1] = np.float32(1e-40)
    p = np.stack([numerics.softmax(row) for row in rng.normal(0, 2, (n_q, n)).astype(np.float32)])
    carried = rng.normal(0, 1, (n_q, head_dim)).astype(np.float32)
    carried[0] = -0.0
    scale = np.float32(1 / np.sqrt(head_dim))
    raw = run_harness(
        harness,
        ["attention_f16", n, n_q, stride, head_dim, float.hex(float(scale)), tile_rows],
        keys.tobytes() + values.tobytes() + f32_bytes(q, p, carried),
    )
    got = np.frombuffer(raw, "<f4")
    assert got.size == n_q * (n + head_dim)
    k32, v32 = keys.astype(np.float32), values.astype(np.float32)
    want_scores = numerics.dot(k32[None, :, :head_dim], q[:, None, :], axis=2) * scale
    terms = np.concatenate([carried[:, None, :], p[:, :, None] * v32[None, :, :head_dim]], axis=1)
    assert_same_bits(got[: n_q * n], want_scores.reshape(-1))
    assert_same_bits(got[n_q * n :], numerics.seq_sum(terms, axis=1).reshape(-1))


def kv_test_values():
    """Floats a KV cache meets and the edges of binary16: normal ones, tiny ones (binary16
    subnormals and below), ties between two binary16 values, the largest binary16 and beyond,
    signed zeros, whole blocks of zeros and a block with one large value."""
    ties = (np.arange(1, 2049, dtype=np.float32) + np.float32(0.5)) * np.float32(2.0**-10)  # halfway in [1, 3)
    edges = np.array([0.0, -0.0, 65504.0, -65504.0, 65519.0, 65520.0, 1e6, -1e30, 2.0**-24, 2.0**-25, 3e-8], np.float32)
    x = np.concatenate(
        [
            rng.normal(0, 1, 4096).astype(np.float32),
            rng.normal(0, 1e-5, 1024).astype(np.float32),
            ties,
            edges,
            np.zeros(64, np.float32),
            np.r_[np.float32(300.0), rng.normal(0, 0.01, 31).astype(np.float32)],
        ]
    )
    return np.concatenate([x, np.zeros(-x.size % 32, np.float32)])


def test_kv_cache_f16_rounds_to_nearest_even_saturating(harness):
    """An f16 KV cache stores kernel_float_to_half(x) and reads back its exact float32 value: the
    reference's numbers (generator/numerics/kv_cache.py), NumPy's binary16 rounding, +-65504 for
    anything larger."""
    from generator.numerics.kv_cache import kv_round, to_half_saturating

    x = kv_test_values()
    raw = run_harness(harness, ["kv_f16", x.size], f32_bytes(x))
    halves = np.frombuffer(raw[: 2 * x.size], "<u2")
    wide = np.frombuffer(raw[2 * x.size :], "<f4")
    assert np.array_equal(halves, to_half_saturating(x).view(np.uint16))
    assert_same_bits(wide, kv_round(x, "f16"))
    assert to_half_saturating(np.float32(1e6)) == np.float16(65504)
    assert np.array_equal(kv_round(x, "f16"), np.clip(x, -65504, 65504).astype(np.float16).astype(np.float32))


def test_kv_cache_q8_0_blocks_match_the_reference(harness):
    """A q8_0 KV cache stores the weights' q8_0 blocks of each row (binary16 scales) and reads back
    (float)q * d: the reference's numbers, within half a step of the value."""
    from generator.numerics.kv_cache import kv_round, quantize_kv_q8_0

    x = kv_test_values()
    x = x[np.abs(x) < 1e5]  # a scale beyond binary16's range saturates: the bits still agree, below
    x = np.concatenate([x, np.zeros(-x.size % 32, np.float32)])
    raw = run_harness(harness, ["kv_q8_0", x.size], f32_bytes(x))
    nb = x.size // 32
    qs = np.frombuffer(raw[: x.size], np.int8)
    d = np.frombuffer(raw[x.size : x.size + 2 * nb], "<u2")
    wide = np.frombuffer(raw[x.size + 2 * nb :], "<f4")
    want_q, want_d = quantize_kv_q8_0(x)
    assert np.array_equal(qs, want_q) and np.array_equal(d, want_d.view(np.uint16))
    assert_same_bits(wide, kv_round(x, "q8_0"))
    # Where d is a normal binary16 (11 significant bits), a value is within half a step, plus what
    # rounding d costs the block's largest value (clipped at 127 steps).
    step = np.repeat(want_d.astype(np.float32), 32)
    normal = step >= 2.0**-14
    assert normal.sum() > x.size // 2
    assert np.all(np.abs(wide - x)[normal] <= step[normal] * (0.5 + 127 * 2.0**-11))


# The reduction tree of a quantized row (docs/numerics.md): block b's term goes to partial b % 8,
# each partial sums in block order, then ((p0 + p1) + p2) + ... + p7. Row lengths around the tree's
# width (1, 2, 7, 8, 9, 15, 16, 17 blocks), the SmolLM2 shapes' 18 and 48, and long rows; row counts
# that are not multiples of the kernels' groups (4, 8, 16 rows) or tiles.
TREE_BLOCKS = [1, 2, 7, 8, 9, 15, 16, 17, 18, 48, 131, 520]


def tree_by_definition(terms):
    """The contract, written as plainly as it is stated: float32 partials, one add at a time."""
    out = []
    for row in np.asarray(terms, np.float32):
        part = [np.float32(-0.0)] * numerics.PARTIALS
        for b, t in enumerate(row):
            part[b % numerics.PARTIALS] = np.float32(part[b % numerics.PARTIALS] + t)
        acc = part[0]
        for p in part[1:]:
            acc = np.float32(acc + p)
        out.append(acc)
    return np.array(out, np.float32)


@pytest.mark.parametrize("nb", TREE_BLOCKS)
def test_tree_sum_is_the_stated_tree(nb):
    terms = (rng.normal(0, 1, (5, nb)) * rng.choice([1e-8, 1.0, 1e8], (5, nb))).astype(np.float32)
    terms[0] = -0.0  # a row of -0.0 terms sums to -0.0: partials start from -0.0, not +0.0
    terms[1, ::2] = 0.0
    assert_same_bits(numerics.tree_sum(terms), tree_by_definition(terms))
    assert np.signbit(numerics.tree_sum(terms)[0])
    if nb <= numerics.PARTIALS:  # one term per partial: the plain sequential sum
        assert_same_bits(numerics.tree_sum(terms), numerics.seq_sum(terms, axis=1))


def random_halves(shape) -> np.ndarray:
    """binary16 values of either sign drawn uniformly over the finite encodings: zero, subnormals
    and normals up to 65504, every exponent equally likely."""
    bits = rng.integers(0, 0x7C00, shape).astype(np.uint16) | (rng.integers(0, 2, shape).astype(np.uint16) << 15)
    return bits.view(np.float16)


def extreme_q8_0_operands(rows, nb, tokens=None):
    """Quants at the int8 extremes in some rows, scales anywhere in binary16's range, subnormals
    included (all terms stay finite: a NaN's bits are not the same on every ISA), zero scales, and
    rows of -0.0 terms."""
    cols = nb * 32
    wq = rng.integers(-127, 128, (rows, cols)).astype(np.int8)
    wq[rows // 2] = rng.choice(np.array([-127, 127], np.int8), cols)
    wd = random_halves((rows, nb))
    wd[0, ::3] = 0.0
    wq[-1] = 0
    wd[-1] = -np.abs(wd[-1]) - np.float16(1e-3)  # isum 0 times a negative scale: terms of -0.0
    shape = (nb,) if tokens is None else (tokens, nb)
    xq = rng.integers(-127, 128, shape[:-1] + (cols,)).astype(np.int8)
    xd = (np.abs(rng.normal(0, 1, shape)) * 10.0 ** rng.integers(-8, 8, shape)).astype(np.float32) + np.float32(1e-6)
    return wq, wd, xq, xd


@pytest.mark.parametrize("nb", TREE_BLOCKS)
@pytest.mark.parametrize("rows", [1, 3, 9, 17])
def test_q8_0_matvec_follows_the_tree_at_every_length(harness, rows, nb):
    wq, wd, xq, xd = extreme_q8_0_operands(rows, nb)
    payload = wq.tobytes() + half_bytes(wd) + xq.tobytes() + f32_bytes(xd)
    got = c_floats(harness, ["matvec_q8_0", rows, nb * 32], payload, rows)
    want = matvec_q8_0(wq, wd, xq, xd)
    assert_same_bits(got, want)
    assert np.signbit(got[-1]) and got[-1] == 0.0


@pytest.mark.parametrize("nb", TREE_BLOCKS)
@pytest.mark.parametrize("rows", [1, 5, 9])
def test_q4_0_matvec_follows_the_tree_at_every_length(harness, rows, nb):
    packed, wd = quantize_q4_0(rng.normal(0, 1, (rows, nb * 32)).astype(np.float32))
    wd = random_halves(wd.shape)
    packed[-1] = 0x88  # quants 8 8: the int8 values 0, so terms of -0.0 with a negative scale
    wd[-1] = -np.abs(wd[-1]) - np.float16(1e-3)
    xq, xd = quantize_q8_0(rng.normal(0, 1, nb * 32).astype(np.float32))
    payload = packed.tobytes() + half_bytes(wd) + xq.tobytes() + f32_bytes(xd)
    got = c_floats(harness, ["matvec_q4_0", rows, nb * 32], payload, rows)
    assert_same_bits(got, matvec_q8_0(unpack_q4_0(packed), wd, xq, xd))
    assert np.signbit(got[-1]) and got[-1] == 0.0


@pytest.mark.parametrize(
    "tokens,rows,nb", [(2, 3, 1), (9, 33, 7), (8, 8, 9), (13, 17, 17), (64, 5, 18), (3, 2, 131), (2, 3, 520)]
)
def test_batched_products_follow_the_tree(harness, tokens, rows, nb):
    wq, wd, xq, xd = extreme_q8_0_operands(rows, nb, tokens)
    assert_batched_product_is_each_tokens_matvec(harness, "matmul_q8_0", wq, wq, wd, xq, xd)
    packed, pd = quantize_q4_0(rng.normal(0, 1, (rows, nb * 32)).astype(np.float32))
    assert_batched_product_is_each_tokens_matvec(harness, "matmul_q4_0", packed, unpack_q4_0(packed), pd, xq, xd)
