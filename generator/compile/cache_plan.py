"""The expert cache under a RAM budget (Linux boards): what stays resident, how big an expert slot
is, and how many slots the pool the MoE layers share gets from what a budget leaves.

The weight image never depends on the budget: a budget is a run-time input (--memory-budget, the
board file's memory_budget by default). The firmware gets the budget on its command line and
computes the same slot count from the constants this module's numbers are emitted as
(model_def.h: COLIBRI_BUDGET_FIXED_BYTES, COLIBRI_EXPERT_SLOT_BYTES, ...; runtime/expert_cache.c),
so `report` and the check made before anything runs say exactly what the firmware will do.

    resident   every byte of the image except the routed experts' tensors and Gemma 4's per-layer
               input table (read one row per token through the mapping): header, directory,
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

    auto       --memory-budget auto (or auto-MARGIN): the memory the firmware may use where it runs,
               less AUTO_MARGIN_BYTES (or MARGIN). What it may use is the smaller of its memory
               cgroup's limit (cgroup v2 memory.max, v1 memory.limit_in_bytes, the smallest up the
               hierarchy from /proc/self/cgroup; "max" or 2^62 and above: no limit) and the
               kernel's MemAvailable: a limit above what the machine has free cannot be had either.
               The firmware resolves it at start (bsp/linux/memory_limit.c, the same rule): a
               firmware in another cgroup (tools/in-memory-cgroup) or on a board over SSH sees
               its own. When what is left holds every expert, the run is unlimited (the mapped image
               read in place: the same bits, no copies); when it cannot hold the fixed part and
               experts_per_token slots, it is refused as a too small budget is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ColibriError
from ..sizes import AUTO_MARGIN_BYTES, AutoBudget, format_size, parse_budget, parse_size  # noqa: F401 (used by callers too)
from .layout import align_up, expert_groups, rank_image
from .plan import Plan

STORAGE_ALIGN = 4096  # O_DIRECT: file offsets, lengths and buffers in multiples of this
NO_LIMIT_FROM = 2**62  # a cgroup limit this large is no limit (v1 writes 2^63 - 4096 for none)


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
    # A layer's experts are one group of extents of its stride (plan.expert_groups checks the layout).
    groups = expert_groups(plan.spec, plan.tensors)
    expert_bytes = max((g.stride for g in groups), default=0)
    # +1 block: an extent starting at any 64-byte boundary, read from the 4 KiB boundary below it.
    slot_bytes = align_up(expert_bytes, STORAGE_ALIGN) + STORAGE_ALIGN if groups else 0
    # Gemma 4's per-layer input table is read a row per token through the mapping: not held either.
    table = plan.paged_table
    resident = plan.image.image_bytes - sum(g.n_experts * g.stride for g in groups) - (table.nbytes if table else 0)
    fixed = (
        resident
        + plan.context_state_bytes
        + plan.scratch_bytes
        + plan.rope_table_bytes
        + plan.expanded_bytes
        + reserve_bytes
    )
    spec = plan.spec
    n_moe = len(groups)
    return CacheConstants(
        n_moe, spec.experts_per_token, spec.n_experts, expert_bytes, slot_bytes, resident, reserve_bytes, fixed
    )


# The hit rates at which report and --json show the bytes a decoded token reads from storage.
REPORTED_HIT_RATES = (0.0, 0.5, 0.9)


@dataclass(frozen=True)
class CachePlan:
    budget: int  # bytes; 0: unlimited (experts used straight from the mapped image)
    constants: CacheConstants
    slots: int  # in the pool the MoE layers share; 0 when unlimited or the model has no routed experts
    auto: AutoChoice | None = None  # how --memory-budget auto chose `budget` on this machine

    @property
    def firmware_budget(self) -> int | AutoBudget:
        """What the firmware is given: auto resolves itself where it runs (the same rule)."""
        return self.auto.request if self.auto else self.budget

    def as_run(self, ran: AutoRan | None) -> CachePlan:
        """The cache the firmware ran with (`ran`: what its stats frame says auto chose,
        session.CacheStats.auto_ran): under auto what it found where it ran, which may have moved
        since this plan; else this plan."""
        return plan_as_ran(self.constants, ran) if self.auto and ran else self

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

    def to_dict(self, hit_rates: tuple[float, ...] = REPORTED_HIT_RATES) -> dict[str, object]:
        c = self.constants
        return {
            "budget": self.budget,
            "unlimited": self.unlimited,
            "resident_bytes": c.resident_bytes,
            "fixed_bytes": c.fixed_bytes,
            "reserve_bytes": c.reserve_bytes,
            "moe_layers": c.n_moe_layers,
            "expert_bytes": c.expert_bytes,
            "slot_bytes": c.slot_bytes,
            "slots": self.slots,
            "slots_per_layer": self.slots_per_layer,
            "routed_experts": c.max_slots,
            "pool_bytes": self.pool_bytes,
            "min_budget": c.min_budget,
            "bytes_read_per_token": {f"{h:g}": self.bytes_read_per_token(h) for h in hit_rates},
            "auto": self.auto.to_dict(self.budget) if self.auto else None,
        }


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


def too_small(plan: Plan, c: CacheConstants, what: str) -> str:
    """The one line that refuses a budget (`what`: how it was given), with the numbers."""
    need = c.min_budget
    slots_part = (
        f" + {c.experts_per_token} expert slots (one token's experts of one layer) x {c.slot_bytes:,} B"
        if c.n_moe_layers
        else ""
    )
    return (
        f"{what} is too small for {plan.spec.name} "
        f"({plan.quant}, context {plan.n_ctx}): it needs at least {need:,} B ({format_size(need)}) = resident "
        f"weights {c.resident_bytes:,} B + KV cache {plan.context_state_bytes:,} B + scratch {plan.scratch_bytes:,} B + "
        f"RoPE tables {plan.rope_table_bytes:,} B + reserve {c.reserve_bytes:,} B{slots_part}"
    )


def cache_plan(plan: Plan, reserve_bytes: int, budget: int) -> CachePlan:
    """The cache under `budget`, or a one-line refusal with the numbers when it cannot hold the
    resident part, the arenas and experts_per_token slots per MoE layer."""
    c = cache_constants(plan, reserve_bytes)
    slots = slots_for_budget(c, budget)
    if slots is None:
        raise ColibriError(too_small(plan, c, f"--memory-budget {budget:,} B ({format_size(budget)})"))
    return CachePlan(budget, c, slots)


# ---- --memory-budget auto: the memory the firmware may use where it runs ----------------------


@dataclass(frozen=True)
class MemoryFound:
    """What auto found: the smaller of a memory cgroup's limit and MemAvailable, and from where."""

    nbytes: int
    source: str  # "cgroup-v2", "cgroup-v1" or "meminfo" (as the firmware's stats frame says it)
    where: str  # the file the number was read from

    def describe(self) -> str:
        what = {"cgroup-v2": "cgroup v2 limit", "cgroup-v1": "cgroup v1 limit", "meminfo": "MemAvailable"}[self.source]
        return f"{what} {format_size(self.nbytes)} ({self.nbytes:,} B, {self.where})"


def _limit_value(text: str) -> int | None:
    """A cgroup limit file's value; None for "max" (v2), NO_LIMIT_FROM or more (v1's none) or no number."""
    if not re.fullmatch(r"[0-9]+\n?", text):
        return None
    value = int(text)
    return value if value < NO_LIMIT_FROM else None


def cgroup_limit(root: Path = Path("/")) -> MemoryFound | None:
    """The smallest memory limit on this process's cgroups, each walked up to its hierarchy's root:
    v2 (the "0::PATH" line of /proc/self/cgroup) under sys/fs/cgroup, v1 (the line whose controllers
    include memory) under sys/fs/cgroup/memory. Levels whose files are missing are skipped (a
    container sees its own cgroup as the root). None: no limit."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    best = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        ident, controllers, path = parts
        if ident == "0" and controllers == "":
            base, name, source = root / "sys/fs/cgroup", "memory.max", "cgroup-v2"
        elif "memory" in controllers.split(","):
            base, name, source = root / "sys/fs/cgroup/memory", "memory.limit_in_bytes", "cgroup-v1"
        else:
            continue
        levels = [p for p in path.strip("/").split("/") if p]
        for depth in range(len(levels), -1, -1):
            file = base.joinpath(*levels[:depth]) / name
            try:
                value = _limit_value(file.read_text())
            except OSError:
                continue
            if value is not None and (best is None or value < best.nbytes):
                best = MemoryFound(value, source, "/" + str(file.relative_to(root)))
    return best


def mem_available(root: Path = Path("/")) -> MemoryFound | None:
    """The kernel's MemAvailable (/proc/meminfo): what it can give without swapping."""
    try:
        text = (root / "proc/meminfo").read_text()
    except OSError:
        return None
    m = re.search(r"^MemAvailable:\s+([0-9]+) kB$", text, re.MULTILINE)
    return MemoryFound(int(m.group(1)) * 1024, "meminfo", "/proc/meminfo") if m else None


def find_memory(root: Path = Path("/")) -> MemoryFound | None:
    """What auto starts from on this machine (root: a fake tree in tests): the smaller of the
    cgroup limit and MemAvailable, the cgroup's on a tie. bsp/linux/memory_limit.c is the same rule."""
    found = [f for f in (cgroup_limit(root), mem_available(root)) if f is not None]
    return min(found, key=lambda f: f.nbytes) if found else None


@dataclass(frozen=True)
class AutoChoice:
    """How --memory-budget auto chose its budget from what it found here."""

    request: AutoBudget
    found: MemoryFound

    @property
    def usable(self) -> int:
        return max(self.found.nbytes - self.request.margin, 0)

    def describe(self, unlimited: bool = False) -> str:
        """ "cgroup v1 limit 4.50 GiB (...) - margin 128.0 MiB = 4.37 GiB": the arithmetic, one phrase
        (`unlimited`: it chose no budget, since that holds the whole model)."""
        usable = format_size(self.usable) + (f" ({self.usable:,} B)" if self.usable >= 2**20 else "")
        text = f"{self.found.describe()} - margin {format_size(self.request.margin)} = {usable}"
        return text + (": it holds the whole model, so unlimited (the mapped image read in place)" if unlimited else "")

    def to_dict(self, budget: int) -> dict[str, object]:
        return {
            "found": self.found.nbytes,
            "source": self.found.source,
            "where": self.found.where,
            "margin": self.request.margin,
            "usable": self.usable,
            "whole_model": budget == 0,
            "why": self.describe(budget == 0),
        }


def auto_budget(c: CacheConstants, usable: int) -> int | None:
    """The budget auto gives the firmware from `usable` bytes (runtime: bsp/linux/budget.c): 0
    (unlimited) when it holds every expert in a slot, so the whole model; None when it is too small."""
    if usable >= c.budget_for(c.max_slots):
        return 0
    return usable if usable > 0 and slots_for_budget(c, usable) is not None else None


def auto_cache_plan(plan: Plan, reserve_bytes: int, request: AutoBudget, found: MemoryFound | None) -> CachePlan:
    """The cache --memory-budget auto gives on a machine where `found` is what the firmware may use,
    or a one-line refusal with the numbers."""
    if found is None:
        raise ColibriError(
            "--memory-budget auto: this machine shows no memory cgroup limit and no MemAvailable "
            "(/proc/self/cgroup, /proc/meminfo); give the budget as a size, e.g. --memory-budget 4G"
        )
    c = cache_constants(plan, reserve_bytes)
    choice = AutoChoice(request, found)
    budget = auto_budget(c, choice.usable)
    if budget is None:
        raise ColibriError(too_small(plan, c, f"--memory-budget {request} ({choice.describe()})"))
    return CachePlan(budget, c, slots_for_budget(c, budget), choice)


@dataclass(frozen=True)
class AutoElsewhere:
    """--memory-budget auto for a firmware this machine cannot look into (on a board over SSH, or
    started under COLIBRI_FIRMWARE_PREFIX in another cgroup): it resolves the budget where it runs,
    refuses one too small itself, and its stats frame says what it chose (as_run)."""

    request: AutoBudget
    constants: CacheConstants

    @property
    def firmware_budget(self) -> AutoBudget:
        return self.request

    def as_run(self, ran: AutoRan | None) -> CachePlan:
        if ran is None:
            raise ColibriError(
                "the board's stats frame does not say what --memory-budget auto chose there (firmware older than auto?)"
            )
        return plan_as_ran(self.constants, ran)


@dataclass(frozen=True)
class AutoRan:
    """What a firmware under --memory-budget auto chose where it ran (its stats frame)."""

    budget: int
    choice: AutoChoice


def plan_as_ran(c: CacheConstants, ran: AutoRan) -> CachePlan:
    """The cache a firmware under auto ran with: its budget, and what it found where it ran."""
    return CachePlan(ran.budget, c, slots_for_budget(c, ran.budget) or 0, ran.choice)


# ---- --memory-budget over MPI ranks: each rank's share (layout.rank_image) ----------------------


@dataclass(frozen=True)
class RankShare:
    """What one rank holds: its weight image (mapped) and its arenas (its KV cache: its KV groups'
    part on layers split by KV group, the plan's kv_bytes being a rank's; the scratch and tables,
    whole), with the board's reserve: its memory. Under a budget that does not hold
    it whole, the rank keeps its resident part and pages its own routed experts (e mod ranks)
    through slots, as one board does (runtime/expert_cache.c; model_data.c's colibri_rank_budgets
    carries fixed_bytes, memory_bytes and experts_per_layer, so the firmware computes the same slots)."""

    rank: int
    image_bytes: int
    arena_bytes: int
    reserve_bytes: int
    expert_bytes: int  # its routed experts' extents in its image
    experts_per_layer: int  # routed experts of each MoE layer it holds (e mod ranks == rank)
    n_moe_layers: int
    experts_per_token: int
    slot_bytes: int
    paged_bytes: int = 0  # Gemma 4's per-layer input table: read through the mapping, never held
    budget: int = 0  # --memory-budget each rank is given (0: none)
    kv_cache_bytes: int = 0  # its KV cache, in arena_bytes: its KV groups' only on layers split by KV group

    @property
    def memory_bytes(self) -> int:
        return self.image_bytes + self.arena_bytes + self.reserve_bytes

    @property
    def fixed_bytes(self) -> int:
        """What it holds whatever the budget: its image without its routed experts, the arenas, the reserve."""
        return self.memory_bytes - self.expert_bytes - self.paged_bytes

    @property
    def max_slots(self) -> int:
        return self.n_moe_layers * self.experts_per_layer

    @property
    def min_slots(self) -> int:
        """A token's experts of one layer that can live on this rank at once."""
        return min(self.experts_per_token, self.experts_per_layer) if self.n_moe_layers else 0

    @property
    def min_budget(self) -> int:
        return min(self.fixed_bytes + self.min_slots * self.slot_bytes, self.memory_bytes)

    @property
    def slots(self) -> int:
        """Expert slots under the budget (runtime/expert_cache.c computes the same); 0 when it holds
        the whole share (the image read in place) or there is no budget."""
        if not self.budget or self.budget >= self.memory_bytes:
            return 0
        return min((self.budget - self.fixed_bytes) // self.slot_bytes, self.max_slots)

    def to_json(self) -> dict[str, int]:
        return {
            "rank": self.rank,
            "image_bytes": self.image_bytes,
            "memory_bytes": self.memory_bytes,
            "fixed_bytes": self.fixed_bytes,
            "min_budget": self.min_budget,
            "slot_bytes": self.slot_bytes,
            "slots": self.slots,
            "routed_experts": self.max_slots,
            "kv_cache_bytes": self.kv_cache_bytes,
        }


def rank_shares(plan, reserve_bytes: int, budget: int = 0) -> tuple[RankShare, ...]:
    """Every rank's share of a build for plan.ranks ranks (`plan`: compile/plan.py's Plan) under
    `budget` (0: none)."""
    arenas = plan.context_state_bytes + plan.scratch_bytes + plan.rope_table_bytes + plan.expanded_bytes
    c = cache_constants(plan, reserve_bytes)
    groups = expert_groups(plan.spec, plan.tensors)
    table = plan.paged_table
    # What every rank shares: the arenas, the reserve, the cache's shape.
    common = dict(arena_bytes=arenas, reserve_bytes=reserve_bytes, n_moe_layers=c.n_moe_layers,
                  experts_per_token=c.experts_per_token, slot_bytes=c.slot_bytes,
                  paged_bytes=table.nbytes if table else 0, budget=budget,
                  kv_cache_bytes=plan.kv_bytes)  # fmt: skip
    shares = []
    for r in range(plan.ranks):
        held = len(range(r, plan.spec.n_experts, plan.ranks)) if groups else 0
        # (one rank's image is the whole one: not laid out again at every build's emission)
        image = (
            plan.image.image_bytes
            if plan.ranks == 1
            else rank_image(plan.spec, plan.tensors, r, plan.ranks).image.image_bytes
        )
        experts = sum(held * g.stride for g in groups)
        shares.append(RankShare(r, image, expert_bytes=experts, experts_per_layer=held, **common))
    return tuple(shares)


@dataclass(frozen=True)
class RankBudget:
    """--memory-budget over MPI ranks: the size every rank is given (0: none), and each rank's share
    under it (report shows them; the firmware of each rank computes its own slots the same way)."""

    budget: int
    shares: tuple[RankShare, ...]

    @property
    def firmware_budget(self) -> int:
        return self.budget

    def as_run(self, ran: AutoRan | None) -> None:
        """bench's one-board cache plan: none over ranks (each rank's slots: report --ranks)."""
        return None


def check_rank_budget(plan, reserve_bytes: int, given: int | AutoBudget) -> RankBudget:
    """--memory-budget on ranks applies to each rank: every rank must hold its fixed part (its image
    without its routed experts, the arenas, the reserve) and one token's experts of one layer that
    live on it; its other experts go through its slots. Else the first that cannot is named."""
    if isinstance(given, AutoBudget):
        # Ranks on one host would each find the same free memory and each take it all.
        raise ColibriError(
            "--memory-budget auto is not taken on MPI ranks: ranks sharing a host would each take all of "
            "its free memory; give each rank's budget as a size (report --ranks N --memory-budget SIZE shows "
            "each rank's least)"
        )
    budget, flag = given, f"--memory-budget {given:,} B"
    shares = rank_shares(plan, reserve_bytes, budget)
    for share in shares:
        if budget and budget < share.min_budget:
            need = max(s.min_budget for s in shares)
            slots_part = (
                f" + {share.min_slots} expert slots (a token's experts of one layer on it) x {share.slot_bytes:,} B"
                if share.min_slots
                else ""
            )
            raise ColibriError(
                f"{flag} does not hold rank {share.rank}'s share of {plan.spec.name} over {plan.ranks} ranks: "
                f"it needs at least {share.min_budget:,} B = its weight image without its routed experts "
                f"{share.fixed_bytes - share.arena_bytes - share.reserve_bytes:,} B + KV cache, scratch and tables "
                f"{share.arena_bytes:,} B + reserve {share.reserve_bytes:,} B{slots_part}; give each rank at least "
                f"{need:,} B, or run over more ranks"
            )
    return RankBudget(budget, shares)
