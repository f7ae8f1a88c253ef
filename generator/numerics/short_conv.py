"""LFM2's gated short convolution, one position of one layer (firmware_src/runtime/short_conv.c
computes the same, operation for operation; docs/numerics.md, "Gated short convolution").

in_proj makes B, C and x (hidden wide each, in that order); b_t = B * x is the convolution's input.
The layer's state is a ring of the last `rows` inputs, position p in row p % rows, zeroed when a
sequence starts: out_c = sum_j taps[c, j] * b(p - kernel + 1 + j)[c] over j = 0 .. kernel - 1, in j
order, b of a position before 0 being 0; the output C * out. A ring longer than the kernel keeps
inputs a later position no longer reads, so a pass may step back: after a speculative pass whose
drafts were dropped, the next position reads exactly the inputs plain decoding would have (the
rows of the dropped positions are written again before they are read), as long as no pass is
longer than rows - kernel + 1 tokens (compile/arenas.short_conv_ring_rows).
"""

from __future__ import annotations

import numpy as np

from .ops import f32, seq_sum


def short_conv_step(ring: np.ndarray, pos: int, bcx: np.ndarray, taps: np.ndarray) -> np.ndarray:
    """The convolution's gated output at position `pos` (ring updated): ring (rows, hidden), bcx the
    in_proj output (3 * hidden), taps (hidden, kernel)."""
    rows, d = ring.shape
    kernel = taps.shape[1]
    bcx = f32(bcx)
    b, c, x = bcx[:d], bcx[d : 2 * d], bcx[2 * d :]
    ring[pos % rows] = b * x
    window = ring[[(pos - kernel + 1 + j) % rows for j in range(kernel)]]  # (kernel, hidden), oldest first
    out = seq_sum(f32(taps).T * window, axis=0)
    return c * out
