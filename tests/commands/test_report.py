"""report: the memory plan per region, checked against the linked ELF."""

import json

import pytest
from conftest import run_cli

from generator.compile.elfsize import read_elf
from generator.report import check_elf_against_plan


@pytest.fixture
def llama(checkpoints, builder):
    """The llama test model built for the host at context 64: the model's path, the build and its plan."""
    model = checkpoints("llama_gqa_linear")
    board, art, plan = builder.build(model, "q8_0", 64)
    return model, art, plan


def report_of(model, art, *flags: str) -> str:
    """./colibri report of the llama build (its context 64): what it printed, which must be a success."""
    done = run_cli("report", "--model", model, "--ctx", "64", "--out", art.out_dir, *flags)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_report_json_accounts_for_every_category_and_matches_the_elf(llama):
    model, art, plan = llama
    rep = json.loads(report_of(model, art, "--json"))
    (region,) = rep["regions"]
    assert region["name"] == "ram" and region["budget"] == 0 and rep["fits"]
    assert region["items"]["weights"] == plan.image.image_bytes
    assert region["items"]["kv_cache"] == plan.kv_bytes == 2 * 2 * 64 * 48 * 2  # f16: 2 bytes a value
    assert region["items"]["scratch"] == plan.scratch_bytes
    assert region["items"]["code"] > 1000
    assert region["used"] == sum(region["items"].values())
    assert rep["largest_ctx_that_fits"] is None  # the host has no fixed budget

    elf = read_elf(art.program)
    check_elf_against_plan(plan, elf)
    assert elf.symbols["colibri_key_cache"] == plan.kv_bytes // 2


@pytest.mark.slow
def test_report_text_names_the_region_and_totals(llama):
    model, art, _ = llama
    text = report_of(model, art)
    assert "region ram" in text and "kv_cache" in text and "total" in text


def test_the_report_and_the_plan_share_one_largest_context_rule():
    from generator.boards import load_board
    from generator.compile.elfsize import ElfSizes
    from generator.compile.plan import largest_fitting_ctx, largest_planned_ctx, plan_for_board
    from generator.files import DEFAULT_MODEL
    from generator.model.load import load_model
    from generator.report import linked_use

    board = load_board("esp32p4")
    spec = load_model(DEFAULT_MODEL, load_tensors=False).spec
    plan = plan_for_board(spec, board, "q8_0", 64, kv_type="f32")  # with f16 the whole model fits
    planned = largest_planned_ctx(board, plan)
    assert 64 < planned < plan.spec.max_position_embeddings  # L2MEM, not the model, sets the limit

    def linked(code: int) -> ElfSizes:
        return ElfSizes(
            code=code, rodata=plan.rope_table_bytes, bss=plan.kv_bytes + plan.scratch_bytes + plan.expanded_bytes
        )

    # Linked code exactly the board's reserve: the same answer as before compiling.
    assert largest_fitting_ctx(board, plan, linked_use(board, plan, linked(board.code_reserve))) == planned
    # More code leaves less room for the context.
    assert largest_fitting_ctx(board, plan, linked_use(board, plan, linked(board.code_reserve + 20_000))) < planned


@pytest.mark.slow
def test_report_shows_the_selftests_bytes_what_other_data_is_made_of_and_why_a_row_is_absent(llama):
    model, art, _ = llama
    rep = json.loads(report_of(model, art, "--json"))
    elf = read_elf(art.program)
    assert rep["selftest"]["code"] == elf.selftest["code"] > 0 and rep["selftest"]["boot"] is False
    (region,) = rep["regions"]
    parts = rep["other_data"]
    assert sum(parts.values()) == region["items"]["other_data"]
    # The AVX2 kernels' thread-local buffers: one copy per thread, the most of other_data.
    tls = sum(size for name, size in elf.sections.items() if name in (".tbss", ".tdata"))
    assert parts["per_thread"] == tls > region["items"]["other_data"] // 2
    assert parts["selftest"] == elf.selftest["rodata"] + elf.selftest["ram"]
    assert parts["c_library"] == elf.data_owners["c_library"]
    assert rep["absent_rows"]["expanded_weights"].startswith("this board reads q4_0 blocks as they are")

    text = report_of(model, art)
    assert f"self-test (on a selftest request; its bytes are counted above): {elf.selftest['code']:,} B code" in text
    assert f"other_data is {region['items']['other_data']:,} B: {tls:,} B a thread" in text
    assert "--threads 2 holds 2 copies" in text
    assert "not shown: expanded_weights (this board reads q4_0 blocks as they are" in text
    assert "stack 0 B: a Linux program's stacks are not in its ELF" in text
