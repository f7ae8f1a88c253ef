"""Memory report: every byte of the firmware per memory region (plan, checked against the ELF),
against the board's budgets, with the largest context that would still fit."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable

from .boards import CATEGORIES, KV_TYPES, Board
from .compile.cache_plan import REPORTED_HIT_RATES, CachePlan
from .compile.elfsize import ElfSizes
from .compile.plan import (
    Plan,
    RegionUse,
    fit_problem,
    largest_fitting_ctx,
    largest_planned_ctx,
    planned_use,
    with_kv_type,
)
from .documents import JsonDocument
from .errors import ColibriError
from .numerics.kv_cache import VALUE_BYTES, kv_arena_bytes

if TYPE_CHECKING:
    from .compile.build import Artifacts
    from .verify import Margins

WITH_CODE = ("stack", "other_data")  # linked beside the code, in whichever region holds it
ROWS = CATEGORIES + WITH_CODE  # what the report shows per region


def check_elf_against_plan(plan: Plan, elf: ElfSizes) -> None:
    """The linked arenas must be exactly the sizes the plan computed."""
    value = VALUE_BYTES[plan.kv_type]
    expected = {
        "colibri_scratch": plan.scratch_bytes,
        "colibri_key_cache": plan.kv_values * value,
        # (latent attention caches no values: its V arena is C's smallest array, one value)
        "colibri_value_cache": max(1, plan.value_arena_values) * value,
        "colibri_rope_cos": plan.rope_table_bytes // 2,
        "colibri_rope_sin": plan.rope_table_bytes // 2,
    }
    if plan.kv_scales:
        expected["colibri_key_scales"] = 2 * plan.kv_scales
        expected["colibri_value_scales"] = 2 * max(1, plan.value_arena_values // 32)
    if plan.expand_q4:
        expected["colibri_expanded"] = plan.expanded_bytes
    if plan.linear_state_bytes:
        expected["colibri_linear_state"] = plan.linear_state_bytes
    for symbol, size in expected.items():
        got = elf.symbols.get(symbol)
        if got != size:
            raise ColibriError(
                f"the linked firmware disagrees with the plan: {symbol} is {got} bytes, the plan says {size} (rebuild)"
            )


def category_bytes(board: Board, plan: Plan, elf: ElfSizes) -> dict[str, int]:
    arenas = plan.context_state_bytes + plan.scratch_bytes + plan.expanded_bytes
    stack = elf.sections.get(".stack", 0)
    embedded = plan.image.image_bytes if board.weights == "embedded" else 0
    return {
        "code": elf.code,
        "weights": plan.image.image_bytes,
        "expanded_weights": plan.expanded_bytes,
        "kv_cache": plan.context_state_bytes,
        "scratch": plan.scratch_bytes,
        "rope_tables": plan.rope_table_bytes,
        "stack": stack,
        # Everything else the ELF holds: constant tables, libc data, other globals.
        "other_data": max(0, elf.rodata - plan.rope_table_bytes - embedded)
        + elf.data
        + max(0, elf.bss - arenas - stack),
    }


def other_data_parts(board: Board, plan: Plan, elf: ElfSizes) -> dict[str, int]:
    """What other_data is made of, measured from the ELF's sections and symbols: per_thread (the
    thread-local sections: each thread of a run holds its own copy, so --threads N holds N), the
    self-test's data, the firmware's other tables and buffers, the C library's (and the compiler's
    run-time's) objects, and the rest: what no symbol claims (dynamic symbols and relocations,
    unwind tables, alignment)."""
    total = category_bytes(board, plan, elf)["other_data"]
    owners = elf.data_owners
    selftest = elf.selftest.get("rodata", 0) + elf.selftest.get("ram", 0)
    parts = {
        "per_thread": owners.get("thread_local", 0),
        "selftest": selftest,
        "firmware": max(0, owners.get("colibri", 0) - selftest),
        "c_library": owners.get("c_library", 0),
    }
    parts["linker_and_unwind"] = max(0, total - sum(parts.values()))
    return parts


# Why a row a board could show is not in its report: no region of the board holds it.
ABSENT_BECAUSE = {
    "expanded_weights": "this board reads q4_0 blocks as they are: they are expanded to int8 at load only on "
    "boards whose file gives a RAM region for them (qemu-rv32, esp32p4-idf)",
}


def absent_rows(board: Board) -> dict[str, str]:
    """The rows no memory region of the board holds, each with why."""
    held = {c for r in board.memory for c in r.holds} | (
        set(WITH_CODE) if any("code" in r.holds for r in board.memory) else set()
    )
    return {
        row: ABSENT_BECAUSE.get(row, f"no memory region of board {board.name} holds it")
        for row in ROWS
        if row not in held
    }


def regions(board: Board, plan: Plan, elf: ElfSizes) -> list[RegionUse]:
    sizes = category_bytes(board, plan, elf)
    out = []
    for region in board.memory:
        holds = set(region.holds)
        if "code" in holds:
            holds.update(WITH_CODE)
        out.append(RegionUse(region.name, region.kind, region.size, {c: sizes[c] for c in ROWS if c in holds}))
    return out


def linked_use(board: Board, plan: Plan, elf: ElfSizes) -> Callable[[Plan], list[RegionUse]]:
    """What a plan at another context would put in each region beside the linked firmware: the
    linked code, the weights, and the context's KV cache, scratch and RoPE tables as planned (the
    plan's categories only: the stack and other linked data are not counted)."""
    fixed = category_bytes(board, plan, elf)

    def uses(trial: Plan) -> list[RegionUse]:
        sizes = dict(
            fixed, kv_cache=trial.context_state_bytes, scratch=trial.scratch_bytes, rope_tables=trial.rope_table_bytes
        )
        return [
            RegionUse(r.name, r.kind, r.size, {c: sizes[c] for c in CATEGORIES if c in r.holds}) for r in board.memory
        ]

    return uses


@dataclass(frozen=True)
class KeptF32(JsonDocument):
    """The matrices a q8_0, q4_0 or q4_1 plan keeps in f32 (rows not whole blocks), with their bytes."""

    tensors: dict[str, int]  # tensor name -> bytes
    bytes: int
    summary: str | None  # one line on them; None when there are none


@dataclass(frozen=True)
class KvTypeRow(JsonDocument):
    """One KV cache type for this model on this board: its bytes at the report's context, per
    position, and the largest context that fits with it (None: no limit on the board)."""

    kv_type: str
    bytes: int
    bytes_per_position: int
    largest_ctx_that_fits: int | None


def kv_type_rows(board: Board, plan: Plan, uses: Callable[[Plan], list[RegionUse]] | None) -> list[KvTypeRow]:
    """Every KV cache type the model can take, with the plan's context and the board's budgets
    (`uses`: what a plan puts in each region, as largest_fitting_ctx takes it)."""
    rows = []
    for kv_type in KV_TYPES:
        try:
            trial = with_kv_type(plan, kv_type)
        except ColibriError:  # the model cannot take it (q8_0 needs heads of whole blocks)
            continue
        per_position = (
            trial.kv_bytes_per_position
            if plan.spec.kv_lora_rank
            else 2 * kv_arena_bytes(plan.spec.kv_dim, kv_type) * sum(1 for s in plan.kv_slots if s)
        )
        rows.append(KvTypeRow(kv_type, trial.kv_bytes, per_position, largest_fitting_ctx(board, trial, uses)))
    return rows


@dataclass(frozen=True)
class MemoryReport:
    """Where every byte goes per memory region, against the board's budgets: from the linked ELF
    (`elf_sections`), or planned only (a configuration alone, nothing linked: the code is the
    board's reserve, `code_estimate`). to_json() is report --json's document."""

    board: str
    model: str
    architecture: str
    quant: str
    n_ctx: int
    q4_0_weights: str | None
    q4_1_weights: str | None
    kept_f32: KeptF32
    gguf: dict[str, Any] | None  # --quant gguf: Plan.gguf_report(), the plan's own JSON
    regions: list[RegionUse]
    largest_ctx_that_fits: int | None  # None: no limit on this board
    fits: bool
    elf_sections: dict[str, int] | None  # section name -> bytes; None: planned only
    code_estimate: int | None  # planned only: the board's code reserve
    memory_budget: CachePlan | None = None  # the expert cache, under --memory-budget
    linear_state: dict[str, Any] | None = None  # Gated DeltaNet layers: Plan.linear_state_report()
    # The self-test's share of the linked firmware (code, rodata, ram bytes) and whether it runs at
    # boot; None: planned only
    selftest: dict[str, Any] | None = None
    per_layer_inputs: dict[str, Any] | None = None  # Gemma 4: Plan.per_layer_inputs_report()
    held: str | None = None  # Plan.held_summary(): tensors kept as the checkpoint holds them
    kv_type: str = "f16"  # the KV cache type of this build
    kv_types: tuple[KvTypeRow, ...] = ()  # every type the model can take: bytes, largest context
    other_data: dict[str, int] | None = None  # other_data_parts(); None: planned only
    absent_rows: dict[str, str] = field(default_factory=dict)  # row -> why no region shows it
    stack_outside_elf: bool = False  # a Linux program: its stacks come at run time, not in its ELF
    mtp_layers: int = 0  # multi-token-prediction layers the checkpoint names, left out (ModelSpec.mtp_layers)
    latent_cache: dict[str, Any] | None = None  # latent attention: latent_cache_report()
    # An MCU's stack and heap at their most, as the last verify of this build measured them (None:
    # not measured), and the stack the linked ELF reserves.
    margins: Margins | None = None
    planned_stack: int | None = None
    # A build over several MPI ranks: each rank's weight image and memory (compile/cache_plan.py RankShare),
    # and the --memory-budget each must fit (0: none)
    ranks: tuple[Any, ...] = ()
    rank_budget: int = 0

    @property
    def planned_only(self) -> bool:
        return self.elf_sections is None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "board": self.board,
            "model": self.model,
            "architecture": self.architecture,
            "quant": self.quant,
            "n_ctx": self.n_ctx,
            "kv_type": self.kv_type,
            "kv_types": [row.to_json() for row in self.kv_types],
            **(
                {"ranks": [share.to_json() for share in self.ranks], "rank_budget": self.rank_budget}
                if self.ranks
                else {}
            ),
            **({"planned_only": True} if self.planned_only else {}),
            "q4_0_weights": self.q4_0_weights,
            "q4_1_weights": self.q4_1_weights,
            "kept_f32": self.kept_f32.to_json(),
            "gguf": self.gguf,
            **({"held": self.held} if self.held else {}),
            **({"code_estimate": self.code_estimate} if self.planned_only else {}),
            "regions": [
                {
                    "name": r.name,
                    "kind": r.kind,
                    "budget": r.budget,
                    "used": r.used,
                    "over_budget": r.over_budget,
                    "items": r.items,
                }
                for r in self.regions
            ],
            **({"elf_sections": self.elf_sections} if self.elf_sections is not None else {}),
            "largest_ctx_that_fits": self.largest_ctx_that_fits,
            "fits": self.fits,
        }
        if self.memory_budget is not None:
            out["memory_budget"] = self.memory_budget.to_dict()
        if self.linear_state is not None:
            out["linear_state"] = self.linear_state
        if self.selftest is not None:
            out["selftest"] = self.selftest
        if self.other_data is not None:
            out["other_data"] = self.other_data
        out["absent_rows"] = self.absent_rows
        if self.per_layer_inputs is not None:
            out["per_layer_inputs"] = self.per_layer_inputs
        if self.mtp_layers:
            out["mtp_layers_left_out"] = self.mtp_layers
        if self.latent_cache is not None:
            out["latent_cache"] = self.latent_cache
        if self.margins is not None:
            out["margins"] = {
                **self.margins.to_json(),
                "planned_stack": self.planned_stack,
                "warnings": self.margins.warnings(self.planned_stack),
            }
        return out


def linked_report(board: Board, plan: Plan, elf: ElfSizes) -> MemoryReport:
    """The report of a linked firmware (its arenas checked against the plan first)."""
    check_elf_against_plan(plan, elf)
    uses = linked_use(board, plan, elf)
    largest = largest_fitting_ctx(board, plan, uses)
    rep = _report(
        board,
        plan,
        regions(board, plan, elf),
        largest,
        elf_sections=elf.sections,
        code_estimate=None,
        kv_types=kv_type_rows(board, plan, uses),
    )
    return replace(
        rep,
        latent_cache=latent_cache_report(board, plan, uses),
        selftest={**elf.selftest, "boot": board.selftest.boot, "steps": board.selftest.steps},
        other_data=other_data_parts(board, plan, elf),
        stack_outside_elf=board.runner.linux_program and ".stack" not in elf.sections,
    )


def kept_f32_of(plan: Plan) -> KeptF32:
    """The matrices the plan keeps in f32."""
    return KeptF32({n: plan.tensor(n).nbytes for n in plan.kept_f32}, plan.kept_f32_bytes, plan.kept_f32_summary())


def planned_report(board: Board, plan: Plan) -> MemoryReport:
    """The report for a configuration alone (no weights, nothing linked): the code is the board's
    reserve, and a region that does not fit says so with the numbers."""
    uses = planned_use(board, plan)
    largest = largest_planned_ctx(board, plan)
    rep = _report(
        board,
        plan,
        uses,
        largest,
        elf_sections=None,
        code_estimate=board.code_reserve,
        kv_types=kv_type_rows(board, plan, None),
    )
    return replace(rep, latent_cache=latent_cache_report(board, plan, None))


def _report(
    board: Board,
    plan: Plan,
    uses: list[RegionUse],
    largest_ctx: int | None,
    elf_sections: dict[str, int] | None,
    code_estimate: int | None,
    kv_types: list[KvTypeRow],
) -> MemoryReport:
    return MemoryReport(
        board=board.name,
        model=plan.spec.name,
        architecture=plan.spec.architecture,
        quant=plan.quant,
        n_ctx=plan.n_ctx,
        q4_0_weights=plan.q4_0_weights,
        q4_1_weights=plan.q4_1_weights,
        kept_f32=kept_f32_of(plan),
        gguf=plan.gguf_report() if plan.gguf_types else None,
        regions=uses,
        largest_ctx_that_fits=largest_ctx,
        fits=not any(u.over_budget for u in uses),
        elf_sections=elf_sections,
        code_estimate=code_estimate,
        linear_state=plan.linear_state_report(),
        per_layer_inputs=plan.per_layer_inputs_report(),
        held=plan.held_summary(),
        kv_type=plan.kv_type,
        kv_types=tuple(kv_types),
        absent_rows=absent_rows(board),
        mtp_layers=plan.spec.mtp_layers,
    )


def format_report(rep: MemoryReport) -> str:
    lines = [
        f"memory report: {rep.model} ({rep.architecture}), {rep.quant}, context {rep.n_ctx}, KV cache {rep.kv_type}, "
        f"board {rep.board}" + (" (planned, not linked: code is the board's reserve)" if rep.planned_only else "")
    ]
    if rep.q4_0_weights:
        lines.append(f"  q4_0 weights: {rep.q4_0_weights}")
    if rep.q4_1_weights:
        lines.append(f"  q4_1 weights: {rep.q4_1_weights}")
    if rep.kept_f32.summary:
        lines.append(f"  {rep.kept_f32.summary}")
    if rep.linear_state:
        lines.append(f"  {rep.linear_state['summary']}")
    if rep.per_layer_inputs:
        lines.append(f"  {rep.per_layer_inputs['summary']}")
    if rep.held:
        lines.append(f"  {rep.held}")
    if rep.latent_cache:
        lines.append(f"  {rep.latent_cache['summary']}")
    if rep.mtp_layers:
        lines.append(
            f"  multi-token-prediction layers left out: {rep.mtp_layers} (the checkpoint's layers past the last; "
            "next-token decoding does not use them)"
        )
    if rep.gguf:
        lines.append(f"  {rep.gguf['summary']}")
        for t in rep.gguf["quantized_again"]:
            lines.append(f"    quantized again: {t['tensor']} ({t['file_type']} in the file, now {t['block_type']})")
    for r in rep.regions:
        budget = f"budget {r.budget:,} B" if r.budget else "no fixed budget"
        lines.append(f"  region {r.name} ({r.kind}, {budget})")
        for name, size in r.items.items():
            lines.append(f"    {name:<16} {size:>14,} B")
        status = "OVER BUDGET" if r.over_budget else ("fits" if r.budget else "")
        share = f" ({100 * r.used / r.budget:.1f}% of budget)" if r.budget else ""
        lines.append(f"    {'total':<16} {r.used:>14,} B{share} {status}".rstrip())
    lines += composition_lines(rep)
    largest = rep.largest_ctx_that_fits
    lines.append(
        "  largest context that fits: "
        + ("no limit on this board" if largest is None else "none" if largest == 0 else str(largest))
    )
    if rep.kv_types:
        lines.append(f"  KV cache by type (--kv-type), at context {rep.n_ctx}:")
        for row in rep.kv_types:
            fit = row.largest_ctx_that_fits
            fits = "no limit on this board" if fit is None else "none" if fit == 0 else f"{fit:,}"
            mark = "  (this build)" if row.kv_type == rep.kv_type else ""
            lines.append(
                f"    {row.kv_type:<5} {row.bytes:>14,} B  {row.bytes_per_position:>9,} B a position  "
                f"largest context that fits: {fits}{mark}"
            )
    if rep.selftest:
        t = rep.selftest
        when = "at boot and on a selftest request" if t["boot"] else "on a selftest request"
        lines.append(
            f"  self-test ({when}; its bytes are counted above): {t['code']:,} B code, {t['rodata']:,} B "
            f"read-only data (golden vectors of {t['steps']} steps, its kernel table), {t['ram']:,} B RAM of its own "
            f"(its fixed input lies in the scratch arena when that is large enough)"
        )
    if rep.margins is not None:
        lines.append(f"  measured by the last verify of this build: {rep.margins.line(rep.planned_stack)}")
        lines += [f"  WARNING: {w}" for w in rep.margins.warnings(rep.planned_stack)]
    if rep.memory_budget:
        lines += budget_lines(rep.memory_budget)
    lines += rank_lines(rep)
    return "\n".join(lines)


def rank_lines(rep: MemoryReport) -> list[str]:
    """A build over several MPI ranks: what each rank maps and holds, against --memory-budget."""
    if not rep.ranks:
        return []
    each = f"--memory-budget {rep.rank_budget:,} B each" if rep.rank_budget else "no --memory-budget"
    lines = [f"  over {len(rep.ranks)} MPI ranks, each mapping its own weight image ({each}):"]
    for share in rep.ranks:
        held = "  fits whole" if rep.rank_budget else ""
        if share.slots:
            held = (
                f"  {share.slots} of its {share.max_slots} routed experts in slots of {share.slot_bytes:,} B "
                f"(fixed {share.fixed_bytes:,} B)"
            )
        lines.append(
            f"    rank {share.rank:<3} weight image {share.image_bytes:>14,} B  KV cache {share.kv_cache_bytes:>12,} B  "
            f"memory {share.memory_bytes:>14,} B{held}"
        )
    return lines


def composition_lines(rep: MemoryReport) -> list[str]:
    """What other_data is made of, why the stack shows 0 on a Linux board, and the rows not shown."""
    lines = []
    if rep.other_data is not None:
        parts = rep.other_data
        total = sum(parts.values())
        per_thread = parts["per_thread"]
        threads = (
            f"{per_thread:,} B a thread (the kernels' thread-local buffers: a run with --threads 2 holds 2 copies, "
            f"{2 * per_thread:,} B), "
            if per_thread
            else ""
        )
        lines.append(
            f"  other_data is {total:,} B: {threads}{parts['selftest']:,} B the self-test's data, "
            f"{parts['firmware']:,} B the firmware's other tables and buffers, {parts['c_library']:,} B the C "
            f"library's and compiler run-time's, {parts['linker_and_unwind']:,} B no symbol claims (the linker's "
            f"tables: dynamic symbols, relocations, unwind data; alignment)"
        )
    if rep.stack_outside_elf:
        lines.append(
            "  stack 0 B: a Linux program's stacks are not in its ELF (the kernel gives the main thread its "
            "stack and each worker thread gets one at run time; the board's budget_reserve covers them)"
        )
    for row, why in rep.absent_rows.items():
        lines.append(f"  not shown: {row} ({why})")
    return lines


def budget_lines(cache: CachePlan) -> list[str]:
    """The expert cache under a memory budget (compile/cache_plan.py), as `report` shows it."""
    c = cache.constants
    why = [f"  memory budget auto on this machine now: {cache.auto.describe(cache.unlimited)}"] if cache.auto else []
    if cache.unlimited:
        return why or ["  memory budget: unlimited (the image is mapped; experts read in place)"]
    lines = why + [
        f"  memory budget {cache.budget:,} B: the firmware keeps (checked before a run, with these numbers)",
        f"    {'resident':<16} {c.resident_bytes:>14,} B  the image without routed experts, locked in RAM",
        f"    {'arenas+reserve':<16} {c.fixed_bytes - c.resident_bytes:>14,} B  KV cache, scratch, RoPE "
        f"tables and the board's reserve {c.reserve_bytes:,} B",
    ]
    if c.n_moe_layers:
        lines += [
            f"    {'expert slots':<16} {cache.pool_bytes:>14,} B  {cache.slots} of {c.max_slots} routed "
            f"experts ({cache.slots_per_layer:.2g} per MoE layer, {c.n_moe_layers} layers) x {c.slot_bytes:,} B "
            f"(an expert is {c.expert_bytes:,} B)",
            f"    {'total':<16} {c.fixed_bytes + cache.pool_bytes:>14,} B  (the least budget that runs: "
            f"{c.min_budget:,} B)",
        ]
        per = ", ".join(f"{h:.0%} hits {cache.bytes_read_per_token(h) / 1e6:.3g} MB" for h in REPORTED_HIT_RATES)
        lines.append(f"    bytes read from storage per decoded token: {per}")
    return lines


def report_problem(rep: MemoryReport) -> str | None:
    """`report`'s closing error when a region is over budget: the same line the check before
    compiling gives (docs/errors.md), from the numbers the report shows."""
    return fit_problem(
        rep.model,
        rep.quant,
        rep.n_ctx,
        rep.board,
        rep.regions,
        "; code is the board's reserve" if rep.planned_only else "",
    )


# ---- Latent attention: its cache against plain attention's of the same heads (each head's keys,
# qk_nope_head_dim + qk_rope_head_dim wide, and values, v_head_dim wide, in the same KV type), and
# the longest context each leaves room for (the one bisection: plan.largest_fitting_ctx) ----


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


def with_margins(rep: MemoryReport, board: Board, art: Artifacts) -> MemoryReport:
    """The report with the stack and heap margins the last verify of this very build measured
    (an MCU's stats frame), against the stack its linked ELF reserves."""
    from .compile.firmware_id import firmware_build_id
    from .verify import planned_stack, recorded_margins

    margins = recorded_margins(art.out_dir, firmware_build_id(board, art.program))
    return replace(rep, margins=margins, planned_stack=planned_stack(board, art.program)) if margins else rep
