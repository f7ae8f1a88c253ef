"""The expert cache under a RAM budget (Linux boards): what stays resident, how big an expert slot
is, and how many slots the pool the MoE layers share gets from what a budget leaves.

The weight image never depends on the budget: a budget is a run-time input (--memory-budget, the
board file's memory_budget by default). The firmware gets the budget on its command line and
computes the same slot count from the constants this module's numbers are emitted as
(model_def.h: COLIBRI_BUDGET_FIXED_BYTES, COLIBRI_EXPERT_SLOT_BYTES, ...; runtime/expert_cache.c),
so `report` and the check made before anything runs say exactly what the firmware will do.

    resident   every byte of the image except the routed experts' tensors: header, directory,
               trailer, embeddings, attention, norms, routers, shared experts, dense layers
    fixed      resident + KV cache + scratch + RoPE tables + expanded weights + the board's
               budget_reserve (code, C library, stacks, the I/O thread)
    slot       one expert's gate, up and down matrices as they lie in the image (one contiguous
               extent), rounded up to STORAGE_ALIGN plus one STORAGE_ALIGN block, so that an
               expert starting anywhere can be read with O_DIRECT at aligned file offsets
    slots      one pool shared by the MoE layers: (budget - fixed) // slot, at most one per routed
               expert, at least experts_per_token (one token's experts of one layer at once) or the
               budget is refused. Evicted least recently used first: as the layers take turns, that
               is a per-layer LRU when there are experts_per_token slots per layer or more, and it
               still runs a model below that (a quarter of a Mixtral-shaped image holds its resident
               part and a few slots, not two per layer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ColibriError
from .plan import Plan, align_up

STORAGE_ALIGN = 4096  # O_DIRECT: file offsets, lengths and buffers in multiples of this
_EXPERT = re.compile(r"layers\.(\d+)\.experts\.(\d+)\.(w_gate|w_up|w_down)$")

_UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "KIB": 2**10, "M": 2**20, "MB": 2**20, "MIB": 2**20,
          "G": 2**30, "GB": 2**30, "GIB": 2**30, "T": 2**40, "TB": 2**40, "TIB": 2**40}


def parse_size(text: str) -> int:
    """A size: plain bytes, or a number with K, M, G or T (binary: 512M = 512 MiB; KB/KiB alike);
    0 (or "unlimited") means no budget. Raises ValueError with the reason."""
    s = str(text).strip().upper().replace("_", "")
    if s in ("UNLIMITED", "NONE"):
        return 0
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([A-Z]*)", s)
    if not m or m.group(2) not in _UNITS:
        raise ValueError(f"expected a size such as 512M, 6G or a number of bytes (0: unlimited), got {text!r}")
    value = float(m.group(1)) * _UNITS[m.group(2)] if "." in m.group(1) else int(m.group(1)) * _UNITS[m.group(2)]
    return int(value)


def format_size(n: int) -> str:
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    if n >= 2**20:
        return f"{n / 2**20:.1f} MiB"
    return f"{n:,} B"


@dataclass(frozen=True)
class ExpertExtent:
    layer: int
    expert: int
    first_tensor: int  # index of its w_gate in the plan's tensors; w_up and w_down follow
    offset: int  # from the data region's start
    nbytes: int  # gate, up and down with their padding: one contiguous extent


def expert_extents(plan: Plan) -> tuple[ExpertExtent, ...]:
    """Every routed expert's extent in the image's data region: its three matrices lie next to
    each other (expert-major layout, model/spec.expected_shapes), which this checks."""
    index = {t.name: i for i, t in enumerate(plan.tensors)}
    out = []
    for i, t in enumerate(plan.tensors):
        m = _EXPERT.match(t.name)
        if not m or m.group(3) != "w_gate":
            continue
        layer, expert = int(m.group(1)), int(m.group(2))
        parts = [plan.tensors[i + k] for k in range(3)]
        names = [f"layers.{layer}.experts.{expert}.{p}" for p in ("w_gate", "w_up", "w_down")]
        if [p.name for p in parts] != names or any(index[n] != i + k for k, n in enumerate(names)):
            raise ColibriError(f"internal: expert {layer}.{expert}'s matrices are not next to each other in the plan")
        for a, b in zip(parts, parts[1:]):
            if align_up(a.offset + a.nbytes) != b.offset:
                raise ColibriError(f"internal: expert {layer}.{expert}'s matrices are not contiguous in the image")
        out.append(ExpertExtent(layer, expert, i, parts[0].offset, parts[2].offset + parts[2].extent - parts[0].offset))
    return tuple(out)


@dataclass(frozen=True)
class CacheConstants:
    """What the firmware is compiled with to size its cache (model_def.h)."""

    n_moe_layers: int
    experts_per_token: int
    n_experts: int
    expert_bytes: int  # the largest expert's extent
    slot_bytes: int  # expert_bytes rounded for aligned reads
    resident_bytes: int
    reserve_bytes: int
    fixed_bytes: int  # resident + arenas + reserve

    @property
    def max_slots(self) -> int:
        return self.n_moe_layers * self.n_experts

    @property
    def min_budget(self) -> int:
        """The least budget that runs: the fixed part and one token's experts of one layer."""
        return self.fixed_bytes + (self.experts_per_token * self.slot_bytes if self.n_moe_layers else 0)

    def budget_for(self, slots: int) -> int:
        """The least budget that gives `slots` slots."""
        return self.fixed_bytes + slots * self.slot_bytes


def cache_constants(plan: Plan, reserve_bytes: int) -> CacheConstants:
    extents = expert_extents(plan)
    expert_bytes = max((e.nbytes for e in extents), default=0)
    # +1 block: an extent starting at any 64-byte boundary, read from the 4 KiB boundary below it.
    slot_bytes = align_up(expert_bytes, STORAGE_ALIGN) + STORAGE_ALIGN if extents else 0
    resident = plan.image.image_bytes - sum(e.nbytes for e in extents)
    fixed = (resident + plan.kv_bytes + plan.scratch_bytes + plan.rope_table_bytes + plan.expanded_bytes
             + reserve_bytes)
    spec = plan.spec
    n_moe = len({e.layer for e in extents})
    return CacheConstants(n_moe, spec.experts_per_token, spec.n_experts, expert_bytes, slot_bytes, resident,
                          reserve_bytes, fixed)


@dataclass(frozen=True)
class CachePlan:
    budget: int  # bytes; 0: unlimited (experts used straight from the mapped image)
    constants: CacheConstants
    slots: int  # in the pool the MoE layers share; 0 when unlimited or the model has no routed experts

    @property
    def unlimited(self) -> bool:
        return self.budget == 0

    @property
    def pool_bytes(self) -> int:
        return self.slots * self.constants.slot_bytes

    @property
    def slots_per_layer(self) -> float:
        return self.slots / self.constants.n_moe_layers if self.constants.n_moe_layers else 0.0

    def bytes_read_per_token(self, hit_rate: float) -> float:
        """Bytes one decoded token reads from storage when a share `hit_rate` of its expert uses find
        the expert in a slot: each miss reads its expert, aligned (slot_bytes at most; an expert's
        aligned read is one STORAGE_ALIGN block less or more than its extent, counted as a slot)."""
        if self.unlimited or not self.constants.n_moe_layers:
            return 0.0
        c = self.constants
        return (1.0 - hit_rate) * c.n_moe_layers * c.experts_per_token * c.slot_bytes

    def to_dict(self, hit_rates=(0.0, 0.5, 0.9)) -> dict:
        c = self.constants
        return {"budget": self.budget, "unlimited": self.unlimited, "resident_bytes": c.resident_bytes,
                "fixed_bytes": c.fixed_bytes, "reserve_bytes": c.reserve_bytes, "moe_layers": c.n_moe_layers,
                "expert_bytes": c.expert_bytes, "slot_bytes": c.slot_bytes, "slots": self.slots,
                "slots_per_layer": self.slots_per_layer, "routed_experts": c.max_slots,
                "pool_bytes": self.pool_bytes, "min_budget": c.min_budget,
                "bytes_read_per_token": {f"{h:g}": self.bytes_read_per_token(h) for h in hit_rates}}


def slots_for_budget(c: CacheConstants, budget: int) -> int | None:
    """Expert slots under `budget` (runtime/expert_cache.c computes the same): 0 when unlimited or
    there are no routed experts, None when the budget is too small."""
    if budget == 0:
        return 0
    if budget < c.fixed_bytes:
        return None
    if not c.n_moe_layers:
        return 0
    slots = (budget - c.fixed_bytes) // c.slot_bytes
    if slots < c.experts_per_token:
        return None
    return min(slots, c.max_slots)


def cache_plan(plan: Plan, reserve_bytes: int, budget: int) -> CachePlan:
    """The cache under `budget`, or a one-line refusal with the numbers when it cannot hold the
    resident part, the arenas and experts_per_token slots per MoE layer."""
    c = cache_constants(plan, reserve_bytes)
    slots = slots_for_budget(c, budget)
    if slots is None:
        need = c.min_budget
        slots_part = (f" + {c.experts_per_token} expert slots (one token's experts of one layer) x "
                      f"{c.slot_bytes:,} B" if c.n_moe_layers else "")
        raise ColibriError(
            f"--memory-budget {budget:,} B ({format_size(budget)}) is too small for {plan.spec.name} "
            f"({plan.quant}, context {plan.n_ctx}): it needs at least {need:,} B ({format_size(need)}) = resident "
            f"weights {c.resident_bytes:,} B + KV cache {plan.kv_bytes:,} B + scratch {plan.scratch_bytes:,} B + "
            f"RoPE tables {plan.rope_table_bytes:,} B + reserve {c.reserve_bytes:,} B{slots_part}")
    return CachePlan(budget, c, slots)
