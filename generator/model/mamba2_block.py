"""Mamba-2's spec fields (the block of family_blocks.Mamba2), checked once for both importers: the
heads split the inner width evenly, the groups split the heads."""

from __future__ import annotations

from ..errors import ColibriError


def mamba2_fields(
    where: str, inner: int, heads: int, groups: int, state: int, kernel: int, keys: tuple[str, str]
) -> dict:
    """The spec's Mamba-2 fields (keys: how the file names the heads and the groups)."""
    heads_key, groups_key = keys
    if inner % heads:
        raise ColibriError(f"{where}: {heads_key} {heads} does not divide the Mamba inner width {inner}")
    if heads % groups:
        raise ColibriError(f"{where}: {groups_key} {groups} does not divide the {heads} Mamba heads")
    return dict(
        mamba_heads=heads,
        mamba_head_dim=inner // heads,
        mamba_groups=groups,
        mamba_state=state,
        mamba_conv_kernel=kernel,
    )
