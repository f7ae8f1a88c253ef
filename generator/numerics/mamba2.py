"""Mamba-2, one position of one layer (Granite 4.0 hybrid; firmware_src/runtime/mamba2.c computes
the same, operation for operation; docs/numerics.md, "Mamba-2").

in_proj makes z (inner wide), xBC (conv_dim = inner + 2 x groups x state) and dt (one per head), in
that order. xBC goes through the causal depthwise convolution: out_c = sum_j taps[c, j] * window[j, c]
over the window (the layer's last kernel - 1 inputs, oldest first, then this one), in j order, plus
the channel's bias, then SiLU; the state drops its oldest input. Its x (heads x head_dim), B and C
(groups x state each; head h reads group h / (heads / groups)) then step each head's state S
(head_dim x state):

    dt = clamp(softplus(dt + dt_bias), dt_min, dt_max)    (dt_max 0: no upper limit)
    dA = exp(dt * A)                                       (A = -exp(A_log), kept as A)
    S[p, n] = S[p, n] * dA + (dt * B[n]) * x[p]
    y[p] = (sum over n in order of S[p, n] * C[n]) + x[p] * D

then y * silu(z), normalised per group of inner / groups channels by RMSNorm with the layer's
weight; out_proj. The state starts at zero with a sequence and cannot step back (a speculative
pass is not offered: compile/plan.speculation_tokens).
"""

from __future__ import annotations

import numpy as np

from ..model.spec import ModelSpec
from .ops import F32, expf, f32, rmsnorm, seq_sum, silu, softplus


def mamba2_step(
    spec: ModelSpec, conv_state: np.ndarray, ssm_state: np.ndarray, proj: np.ndarray, w: dict, p: str
) -> np.ndarray:
    """The gated, normed heads' output y (inner wide) at one position, both states updated:
    conv_state (kernel - 1, conv_dim), ssm_state (heads, head_dim, state); proj in_proj's output;
    w the layer's tensors (names from p)."""
    inner, conv_dim, heads = spec.mamba_inner, spec.mamba_conv_dim, spec.mamba_heads
    groups, n_state, head_dim = spec.mamba_groups, spec.mamba_state, spec.mamba_head_dim
    proj = f32(proj)
    z, xbc, dt = proj[:inner], proj[inner : inner + conv_dim], proj[inner + conv_dim :]
    taps = f32(w[p + "ssm_conv"]).reshape(conv_dim, spec.mamba_conv_kernel)
    window = np.concatenate([conv_state, xbc[None, :]], axis=0)
    xbc = silu(seq_sum(taps.T * window, axis=0) + f32(w[p + "ssm_conv_bias"]))
    conv_state[:] = window[1:]
    x = xbc[:inner].reshape(heads, head_dim)
    b = xbc[inner : inner + groups * n_state].reshape(groups, n_state)
    c = xbc[inner + groups * n_state :].reshape(groups, n_state)
    dt = softplus(dt + f32(w[p + "ssm_dt_bias"]))
    dt = np.maximum(dt, F32(spec.mamba_dt_min))
    if spec.mamba_dt_max:
        dt = np.minimum(dt, F32(spec.mamba_dt_max))
    decay = expf(dt * f32(w[p + "ssm_a"]))
    group = np.arange(heads) // (heads // groups)
    db = dt[:, None] * b[group]  # (heads, state)
    ssm_state[:] = ssm_state * decay[:, None, None] + db[:, None, :] * x[:, :, None]
    y = seq_sum(ssm_state * c[group][:, None, :], axis=2) + x * f32(w[p + "ssm_d"])[:, None]
    gated = (y.reshape(inner) * silu(z)).reshape(groups, inner // groups)
    norm = f32(w[p + "ssm_norm"]).reshape(groups, inner // groups)
    return rmsnorm(gated, norm, spec.rms_norm_eps).reshape(inner)
