"""The one definition of every operation, in NumPy float32, mirrored line for line by
firmware_src/runtime/ops.c and kernels/scalar.c. docs/numerics.md states the rules.

Rules that make the bits match on every target:
- every intermediate is float32 and rounded after each operation (C: -ffp-contract=off);
- a sum runs from the first term to the last: ((t0 + t1) + t2) + ... (np.add.accumulate),
  except a quantized row's block terms, which follow the fixed tree of tree_sum;
- rounding to integer is round-half-to-even, done by adding and subtracting 1.5 * 2^23;
- exp is our own polynomial, never libm's.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
ROUND_MAGIC = F32(12582912.0)  # 1.5 * 2^23: x + M - M rounds |x| < 2^22 to the nearest even integer
LOG2E = F32(1.44269504088896341)
LN2_HI = F32(0.693145751953125)
LN2_LO = F32(1.42860676533018e-06)
EXP_MIN = F32(-87.0)
EXP_MAX = F32(88.0)
# Taylor coefficients 1/k! for the polynomial on |r| <= ln2/2, highest first.
EXP_POLY = [F32(1.0 / 720.0), F32(1.0 / 120.0), F32(1.0 / 24.0), F32(1.0 / 6.0), F32(0.5), F32(1.0), F32(1.0)]


def f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def round_even(v: np.ndarray) -> np.ndarray:
    v = f32(v)
    return (v + ROUND_MAGIC) - ROUND_MAGIC


def seq_sum(terms: np.ndarray, axis: int = -1) -> np.ndarray:
    """Sum along axis from the first term to the last, in float32."""
    terms = f32(terms)
    return np.add.accumulate(terms, axis=axis, dtype=np.float32).take(-1, axis=axis)


PARTIALS = 8  # KERNEL_PARTIALS in firmware_src/runtime/kernels/kernels.h


def tree_sum(terms: np.ndarray) -> np.ndarray:
    """The reduction tree of a quantized row's block terms, along the last axis: term b goes to
    partial b % 8, each partial sums its terms in order starting from -0.0 (which the first term
    replaces exactly), then ((p0 + p1) + p2) + ... + p7. Padding with -0.0 terms changes nothing
    (t + -0.0 == t for every float t), so the blocks are padded to a multiple of 8 and summed as
    (groups, 8): first down the groups, then across the 8 partials."""
    terms = f32(terms)
    nb = terms.shape[-1]
    pad = -nb % PARTIALS
    if pad:
        fill = np.full(terms.shape[:-1] + (pad,), -0.0, dtype=np.float32)
        terms = np.concatenate([terms, fill], axis=-1)
    groups = terms.reshape(terms.shape[:-1] + (-1, PARTIALS))
    partials = seq_sum(groups, axis=-2)
    return seq_sum(partials, axis=-1)


def dot(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return seq_sum(f32(a) * f32(b), axis=axis)


def expf(x: np.ndarray) -> np.ndarray:
    """e^x: 2^n * p(r), x = n ln2 + r. Below -87 gives 0; above 88 is clamped to 88."""
    x = f32(x)
    xc = np.minimum(np.maximum(x, EXP_MIN), EXP_MAX)
    n = round_even(xc * LOG2E)
    r = xc - n * LN2_HI
    r = r - n * LN2_LO
    p = np.full_like(r, EXP_POLY[0])
    for c in EXP_POLY[1:]:
        p = p * r + c
    with np.errstate(invalid="ignore"):  # a NaN input's n: its lane is NaN through p anyway
        scale = ((n.astype(np.int32) + 127) << 23).astype(np.int32).view(np.float32)
    out = p * scale
    return np.where(x < EXP_MIN, F32(0.0), out).astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    x = f32(x)
    return x / (F32(1.0) + expf(-x))


def sigmoid(x: np.ndarray) -> np.ndarray:
    x = f32(x)
    return F32(1.0) / (F32(1.0) + expf(-x))


def tanh(x: np.ndarray) -> np.ndarray:
    """1 - 2 / (exp(2x) + 1), with our exp."""
    x = f32(x)
    return F32(1.0) - F32(2.0) / (expf(F32(2.0) * x) + F32(1.0))


GELU_K = F32(0.7978845608028654)  # sqrt(2 / pi)
GELU_C = F32(0.044715)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation: (0.5 x) (1 + tanh(k (x + c x^3)))."""
    x = f32(x)
    inner = GELU_K * (x + GELU_C * ((x * x) * x))
    return (F32(0.5) * x) * (F32(1.0) + tanh(inner))


def swiglu_clamped(gate: np.ndarray, up: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    """gpt-oss's gated activation (op_swiglu_clamped): g = min(gate, limit), u = clamp(up, -limit,
    limit), (u + 1) * (g * sigmoid(alpha * g)). A NaN stays NaN (the comparisons are false)."""
    gate, up = f32(gate), f32(up)
    a, lim = F32(alpha), F32(limit)
    g = np.where(gate > lim, lim, gate)
    u = np.where(up < -lim, -lim, np.where(up > lim, lim, up))
    glu = g * sigmoid(a * g)
    return ((u + F32(1.0)) * glu).astype(np.float32)


def softmax_with_sink(x: np.ndarray, sink: float) -> np.ndarray:
    """Softmax over x plus one more logit, the sink, dropped after (op_softmax_with_sink):
    m = max(max x, sink); e_i = exp(x_i - m); s = (sum_i e_i in order) + exp(sink - m); e_i / s."""
    x = f32(x)
    sink = F32(sink)
    m = max(np.max(x), sink)
    e = expf(x - m)
    total = seq_sum(e) + expf(np.array([sink - m], dtype=np.float32))[0]
    return e / total


def softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """tanh(x / cap) * cap."""
    return tanh(f32(x) / F32(cap)) * F32(cap)


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """Normalise along the last axis: (x_i * (1 / sqrt(mean(x^2) + eps))) * w_i."""
    x = f32(x)
    n = x.shape[-1]
    ss = dot(x, x)
    mean = ss / F32(n)
    inv = F32(1.0) / np.sqrt(mean + F32(eps), dtype=np.float32)
    return (x * f32(inv)[..., None]) * f32(weight)


def rmsnorm_unscaled(x: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm without a weight (Gemma 4's values): x_i * (1 / sqrt(mean(x^2) + eps)), rmsnorm's
    bits with w = 1."""
    x = f32(x)
    ss = dot(x, x)
    inv = F32(1.0) / np.sqrt(ss / F32(x.shape[-1]) + F32(eps), dtype=np.float32)
    return x * f32(inv)[..., None]


def softmax(x: np.ndarray) -> np.ndarray:
    x = f32(x)
    m = np.max(x)
    e = expf(x - m)
    return e / seq_sum(e)


def exp_sum(x: np.ndarray) -> tuple[np.float32, np.float32]:
    """The parts of log-softmax (op_exp_sum): max x and the sum in order of exp(x - max)."""
    x = f32(x)
    m = np.max(x)
    return m, seq_sum(expf(x - m))


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE on (..., n_heads, head_dim) with cos/sin of shape (head_dim/2,)."""
    x = f32(x)
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    ra = a * cos - b * sin
    rb = b * cos + a * sin
    return np.concatenate([ra, rb], axis=-1).astype(np.float32)


def matvec_f32(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """out_r = sum_j w[r, j] * x[j], sequential in j."""
    return seq_sum(f32(w) * f32(x)[None, :], axis=1)


# ---- Gated DeltaNet (Qwen3.5's linear attention) ----------------------------------------------

LN2 = F32(0.693147180559945309)
SQRT2 = F32(1.41421356237309505)
# 1/(2k+1), highest first: log m = 2 s (1 + s^2/3 + s^4/5 + ...), s = (m - 1) / (m + 1).
LOG_POLY = [F32(1.0 / 13.0), F32(1.0 / 11.0), F32(1.0 / 9.0), F32(1.0 / 7.0), F32(1.0 / 5.0), F32(1.0 / 3.0), F32(1.0)]
SOFTPLUS_LINEAR = F32(20.0)  # above it softplus(x) is x (torch's threshold)
L2_EPS = F32(1e-6)  # the DeltaNet's l2 normalisation of queries and keys


def log(x: np.ndarray) -> np.ndarray:
    """Natural log of normal positive floats: x = m 2^e with m in [sqrt(1/2), sqrt(2)), then
    e ln2 + 2 s p(s^2) with s = (m - 1) / (m + 1) and p the series of atanh up to s^12."""
    x = f32(x)
    bits = x.view(np.int32)
    e = ((bits >> 23) & 0xFF) - 127
    m = ((bits & 0x007FFFFF) | 0x3F800000).view(np.float32)  # m in [1, 2)
    high = m > SQRT2
    m = np.where(high, m * F32(0.5), m).astype(np.float32)
    e = (e + high).astype(np.float32)
    s = (m - F32(1.0)) / (m + F32(1.0))
    s2 = s * s
    p = np.full_like(s2, LOG_POLY[0])
    for c in LOG_POLY[1:]:
        p = p * s2 + c
    return (e * LN2 + (F32(2.0) * s) * p).astype(np.float32)


def attn_temperature(q: np.ndarray, pos: int, floor: int, scale: float) -> np.ndarray:
    """Llama 4's queries on its no-RoPE layers at position pos: times log(1 + (pos + 1) // floor) *
    scale + 1 (our log; exactly 1 below the first floor); unchanged where floor is 0."""
    if not floor:
        return q
    factor = log(F32(1 + (pos + 1) // floor)) * F32(scale) + F32(1.0)
    return f32(q) * factor


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + e^x), x itself above 20. log1p of u = e^x as log(w) * (u / (w - 1)), w = 1 + u,
    which keeps the small u's digits that 1 + u rounds away (u itself where w rounds to 1)."""
    x = f32(x)
    u = expf(np.minimum(x, SOFTPLUS_LINEAR))
    w = F32(1.0) + u
    with np.errstate(divide="ignore", invalid="ignore"):
        small = np.where(w == F32(1.0), u, log(w) * (u / (w - F32(1.0))))
    return np.where(x > SOFTPLUS_LINEAR, x, small).astype(np.float32)


def l2norm(x: np.ndarray) -> np.ndarray:
    """Along the last axis: x_i * (1 / sqrt(sum(x^2) + 1e-6))."""
    x = f32(x)
    inv = F32(1.0) / np.sqrt(dot(x, x) + L2_EPS, dtype=np.float32)
    return x * f32(inv)[..., None]


def conv_step(state: np.ndarray, x: np.ndarray, taps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One position of the causal depthwise convolution: state (kernel - 1, channels) holds the
    previous inputs, oldest first; taps (channels, kernel). out_c = sum_j taps[c, j] * window[j, c]
    over the window (state, then x), in j order; then SiLU. Returns the output and the state that
    follows (the window without its oldest row)."""
    window = np.concatenate([f32(state), f32(x)[None, :]], axis=0)
    out = seq_sum(f32(taps).T * window, axis=0)
    return silu(out), window[1:]


def delta_rule_step(
    state: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, decay: np.float32, beta: np.float32
) -> tuple[np.ndarray, np.ndarray]:
    """The gated delta rule for one head and one position, state S (key_dim, value_dim):
    S = S * decay; m_j = sum_i S_ij k_i; d_j = (v_j - m_j) * beta; S_ij = S_ij + k_i d_j;
    out_j = sum_i S_ij q_i (sums in i order). Returns out and the new S."""
    s = f32(state) * F32(decay)
    k = f32(k)
    memory = seq_sum(s * k[:, None], axis=0)
    delta = (f32(v) - memory) * F32(beta)
    s = s + k[:, None] * delta[None, :]
    return seq_sum(s * f32(q)[:, None], axis=0), s


def gated_rmsnorm(x: np.ndarray, weight: np.ndarray, z: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm of x times SiLU of the gate z: ((x_i * inv) * w_i) * silu(z_i)."""
    return rmsnorm(x, weight, eps) * silu(z)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """Phi-3.5-MoE's LayerNorm of one vector (op_layer_norm): mean = (sum of x in order) / n,
    d = x - mean, var = dot(d, d) / n, ((d * (1 / sqrt(var + eps))) * w) + b."""
    x = f32(x)
    n = F32(x.shape[-1])
    d = x - seq_sum(x) / n
    inv = F32(1.0) / np.sqrt(dot(d, d) / n + F32(eps), dtype=np.float32)
    return (d * inv) * f32(weight) + f32(bias)


def sparsemixer_weights(logits: np.ndarray, chosen: np.ndarray, threshold: float) -> np.ndarray:
    """Phi-3.5-MoE's sparsemixer at inference (op_sparsemixer_weights), as transformers 5.24's in
    eval mode: the weights of the experts `chosen` (the top k of the logits, best first). For the
    expert of rank r, with m its logit, the softmax over the logits of the experts not chosen at an
    earlier rank and within the threshold of m ((m - l_e) / max(|l_e|, m) <= threshold; the others
    -inf), taken at the expert."""
    logits = f32(logits)
    candidates = logits.copy()
    weights = np.empty(len(chosen), dtype=np.float32)
    for rank, expert in enumerate(chosen):
        m = logits[expert]
        with np.errstate(divide="ignore", invalid="ignore"):
            outside = (m - logits) / np.maximum(np.abs(logits), m) > F32(threshold)
        weights[rank] = softmax(np.where(outside, F32(-np.inf), candidates))[expert]
        candidates[expert] = F32(-np.inf)
    return weights
