"""What latent attention's cache saves, as `report` shows it: its bytes per position against those
plain attention of the same heads would cache (each head's keys, qk_nope_head_dim +
qk_rope_head_dim wide, and values, v_head_dim wide, in the same KV type), and the longest context
each leaves room for on the board (the same bisection as every largest context: plan.largest_fitting_ctx)."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from .boards import Board
from .compile.plan import Plan, RegionUse, largest_fitting_ctx, planned_use
from .numerics.kv_cache import kv_arena_bytes


def plain_bytes_per_position(plan: Plan) -> int:
    """Plain attention's cache of the same heads, one position over every layer that keeps one."""
    s = plan.spec
    values = s.n_heads * (s.head_dim + s.v_head_dim)
    return sum(kv_arena_bytes(values, plan.kv_type) for slots in plan.kv_slots if slots)


def latent_cache_report(board: Board, plan: Plan, uses: Callable[[Plan], list[RegionUse]] | None) -> dict | None:
    """The latent cache against plain attention (None without latent attention). `uses`: what a plan
    puts in each region (None: planned, the code the board's reserve)."""
    if not plan.spec.kv_lora_rank:
        return None
    use_of = uses or (lambda trial: planned_use(board, trial))
    latent, plain = plan.kv_bytes_per_position, plain_bytes_per_position(plan)

    def with_plain_cache(trial: Plan) -> list[RegionUse]:
        extra = trial.n_ctx * (plain - latent)  # what plain attention's cache would add at this context
        return [
            replace(u, items={**u.items, "kv_cache": u.items["kv_cache"] + extra}) if "kv_cache" in u.items else u
            for u in use_of(trial)
        ]

    longest = largest_fitting_ctx(board, plan, use_of)
    longest_plain = largest_fitting_ctx(board, plan, with_plain_cache)

    def said(n: int | None) -> str:
        return "no limit on this board" if n is None else "none" if n == 0 else f"{n:,}"

    return {
        "bytes_per_position": latent,
        "plain_bytes_per_position": plain,
        "largest_ctx_that_fits": longest,
        "plain_largest_ctx_that_fits": longest_plain,
        "summary": (
            f"latent attention's cache: {latent:,} B a position ({plan.kv_type}; the latent and the RoPE key), where "
            f"plain attention of the same heads would take {plain:,} B: largest context that fits {said(longest)} "
            f"(plain attention: {said(longest_plain)})"
        ),
    }
