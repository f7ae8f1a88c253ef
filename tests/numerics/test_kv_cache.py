"""KV cache types (f32, f16, q8_0): what the plan reserves, what report says, what a board file and
--kv-type may ask, and that every type decodes the reference's bits on every board and at any
thread count, through prompts that span several attention blocks and key tiles."""

import dataclasses

import numpy as np
import pytest
from conftest import DEFAULT_MODEL

from generator.boards import load_board
from generator.boards.load import board_from_data
from generator.compile.arenas import ATTENTION_BLOCK, KV_TILE
from generator.compile.plan import make_plan, plan_for_board, with_kv_type
from generator.device.runner import run_on_board
from generator.device.session import RunRequest
from generator.errors import ColibriError
from generator.model.load import load_model
from generator.numerics.kv_cache import kv_round
from generator.numerics.sampling import SamplingParams
from generator.reference import Reference

# Longer than an attention block (16 prompt tokens at once) and, with the decode, than a key tile
# (64 positions): blocks, tiles and the tile borders all show up in the sums.
PROMPT = [1 + (7 * i) % 150 for i in range(2 * ATTENTION_BLOCK + 5)]
STEPS = KV_TILE + 12 - len(PROMPT) + 8
SAMPLED = SamplingParams(0.9, top_k=40, top_p=0.95, seed=11)


def spec_of(model_dir):
    return load_model(model_dir, load_tensors=False).spec


def test_plan_reserves_the_bytes_of_each_type(checkpoints):
    spec = spec_of(checkpoints("qwen3_qknorm"))  # 2 layers, 2 KV heads of 32
    host = load_board("host")
    per_position = {
        t: with_kv_type(make_plan(spec, "host", "q8_0", 128), t).kv_bytes // 128 for t in ("f32", "f16", "q8_0")
    }
    values = 2 * spec.n_layers * spec.kv_dim  # keys and values of every layer, one position
    assert per_position == {"f32": 4 * values, "f16": 2 * values, "q8_0": values + values // 32 * 2}
    assert plan_for_board(spec, host, "q8_0", 128).kv_type == "f16"  # the default
    q8 = plan_for_board(spec, host, "q8_0", 128, kv_type="q8_0")
    assert q8.kv_scales == q8.kv_values // 32 and q8.to_dict()["kv_cache"]["type"] == "q8_0"
    # f16 and q8_0 widen a tile per KV head into scratch; f32 reads the cache in place.
    tiles = {t: {b.name for b in with_kv_type(q8, t).scratch} for t in ("f32", "f16")}
    assert "kv_tile" in tiles["f16"] and "kv_tile" not in tiles["f32"]


def test_q8_0_cache_needs_heads_of_whole_blocks(checkpoints):
    spec = spec_of(checkpoints("llama_gqa_linear"))  # head_dim 48: not whole blocks of 32
    with pytest.raises(ColibriError, match="--kv-type q8_0 needs a head width that is a multiple of 32.*head_dim 48"):
        make_plan(spec, "host", "q8_0", 64, kv_type="q8_0")
    with pytest.raises(ColibriError, match="unknown KV cache type"):
        make_plan(spec, "host", "q8_0", 64, kv_type="q4")


def test_board_file_names_its_kv_type(tmp_path):
    host = load_board("host")
    import tomllib

    data = tomllib.loads(host.path.read_text())
    assert board_from_data(dict(data, kv_type="f32"), host.path).kv_type == "f32"
    with pytest.raises(ColibriError, match="kv_type must be one of f32, f16, q8_0, got 'bf16'"):
        board_from_data(dict(data, kv_type="bf16"), host.path)


def test_reference_rounds_each_key_and_value_once_when_written():
    x = np.array([[1.0 + 2.0**-12, 70000.0, -3.0e-8, 0.1] * 8], np.float32)
    assert np.array_equal(kv_round(x, "f32"), x)
    half = kv_round(x, "f16")
    assert half[0, 0] == 1.0 and half[0, 1] == 65504.0 and np.array_equal(kv_round(half, "f16"), half)
    q8 = kv_round(x, "q8_0")
    assert q8.dtype == np.float32 and np.array_equal(kv_round(q8, "q8_0"), q8)  # a stored block is kept


def run_and_compare(builder, model_dir, kv_type, board="host", threads=1, sampling=SAMPLED):
    b, art, plan = builder.build(model_dir, "q8_0", 128, board, kv_type)
    assert plan.kv_type == kv_type
    request = dataclasses.replace(RunRequest(PROMPT, STEPS, sampling, False), threads=threads)
    result = run_on_board(b, art.program, art.weights, request, art.model_hash(), flash_image=art.flash_image)
    ref = Reference(plan, art.weights.read_bytes()).generate(PROMPT, STEPS, sampling, stop_at_eos=False)
    assert result.tokens == ref.tokens
    assert result.digests == ref.digests
    return result


@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
def test_every_kv_type_decodes_the_reference_bits_on_host(kv_type, checkpoints, builder):
    """GQA 2:1, head_dim 32: one thread and two (the KV heads split over them)."""
    model_dir = checkpoints("qwen3_qknorm")
    one = run_and_compare(builder, model_dir, kv_type)
    two = run_and_compare(builder, model_dir, kv_type, threads=2)
    assert one.digests == two.digests


def test_kv_types_change_the_numbers_they_should(checkpoints, builder):
    """The type is in the bits: f16 and q8_0 logits differ from f32's (else the rounding did not
    happen), and each is the reference's (above)."""
    model_dir = checkpoints("qwen3_qknorm")
    digests = {
        t: run_and_compare(builder, model_dir, t, sampling=SamplingParams()).digests for t in ("f32", "f16", "q8_0")
    }
    assert len({tuple(d) for d in digests.values()}) == 3


@pytest.mark.slow
@pytest.mark.parametrize("board", ["linux-aarch64", "qemu-rv32"])
@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
def test_every_kv_type_decodes_the_reference_bits_on_every_board(board, kv_type, checkpoints, builder):
    run_and_compare(builder, checkpoints("qwen3_qknorm"), kv_type, board=board)


@pytest.mark.slow
@pytest.mark.parametrize("board", ["host", "linux-aarch64", "qemu-rv32"])
def test_four_query_heads_on_one_kv_head_read_the_f16_cache_in_place(board, builder):
    """The default model (GQA 4:1, head_dim 16): a decoded token reads the binary16 cache where it
    lies (rv32: each key and value decoded once for the four heads, four positions at a time and the
    rest one by one; the other sets widen it, KV_TILE rows at a time), past a tile's 64 positions."""
    run_and_compare(builder, DEFAULT_MODEL, "f16", board=board)


@pytest.mark.slow
def test_sliding_layers_read_their_f16_ring_in_place_on_qemu_rv32(checkpoints, builder):
    """Gemma 3's sliding layers attend token by token, so rv32 reads their ring in place, wrapped
    around its 4 slots; two query heads per KV head (head by head)."""
    run_and_compare(builder, checkpoints("gemma3_text"), "f16", board="qemu-rv32")


@pytest.mark.slow
@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_sliding_layers_keep_their_ring_with_every_kv_type(kv_type, checkpoints, builder):
    """Gemma 3's sliding layers (window 4, a ring of 4 slots) attend token by token, the global
    ones in blocks: the reference's bits with either rounding."""
    run_and_compare(builder, checkpoints("gemma3_text"), kv_type)


def test_report_shows_each_kv_types_bytes_and_largest_context():
    """On the ESP32-P4 (L2MEM) the bundled model's context is bounded by memory with an f32 cache
    and reaches the model's limit with f16; q8_0 is left out, as the model cannot take it."""
    from generator.files import DEFAULT_MODEL
    from generator.report import format_report, planned_report

    board = load_board("esp32p4")
    spec = spec_of(DEFAULT_MODEL)
    rep = planned_report(board, plan_for_board(spec, board, "q8_0", 64, kv_type="f32"))
    rows = {row.kv_type: row for row in rep.kv_types}
    assert set(rows) == {"f32", "f16"}
    assert rows["f32"].bytes == 2 * rows["f16"].bytes == 2 * 2 * spec.n_layers * 64 * spec.kv_dim * 4 // 2
    assert rows["f32"].largest_ctx_that_fits == rep.largest_ctx_that_fits < spec.max_position_embeddings
    assert rows["f16"].largest_ctx_that_fits == spec.max_position_embeddings
    text = format_report(rep)
    assert "KV cache by type (--kv-type)" in text and "(this build)" in text.split("f32", 2)[-1].splitlines()[0]
    assert rep.to_json()["kv_types"][1]["kv_type"] == "f16"


def test_a_q8_0_cache_links_as_planned(checkpoints, builder):
    """The linked q8_0 arenas (quants, and binary16 scales apart) are the plan's bytes."""
    from generator.compile.elfsize import read_elf
    from generator.report import check_elf_against_plan, linked_report

    board, art, plan = builder.build(checkpoints("qwen3_qknorm"), "q8_0", 128, "host", "q8_0")
    elf = read_elf(art.program)
    check_elf_against_plan(plan, elf)
    assert elf.symbols["colibri_key_scales"] == 2 * plan.kv_values // 32
    assert elf.symbols["colibri_key_cache"] + elf.symbols["colibri_key_scales"] == plan.kv_bytes // 2
    rep = linked_report(board, plan, elf)
    assert rep.kv_type == "q8_0" and [r.kv_type for r in rep.kv_types] == ["f32", "f16", "q8_0"]
