"""q4_0 weights on every board, and prompts that go through the model in batches: always the
reference's bits."""

import json
from dataclasses import replace

import pytest
from conftest import DEFAULT_MODEL, run_cli

from generator.boards import load_board
from generator.compile.plan import make_plan, plan_for_board, planned_use
from generator.model.load import load_model
from generator.numerics.sampling import SamplingParams
from generator.reference import Reference

pytestmark = pytest.mark.slow  # builds and verifies 4-bit firmware on the emulated boards

PROMPT = [1, 21, 51, 68, 104, 44, 74, 51, 100]  # "In the beginning"
SAMPLED = SamplingParams(0.8, top_k=40, top_p=0.95, seed=5)


@pytest.mark.parametrize("board,expanded", [("host", False), ("linux-aarch64", False), ("qemu-rv32", True)])
def test_q4_0_decodes_the_reference_bits_read_in_place_or_expanded(board, expanded, builder):
    art, plan, request, result = builder.run(
        DEFAULT_MODEL, PROMPT, 24, quant="q4_0", ctx=128, sampling=SAMPLED, board=board
    )
    assert plan.expand_q4 is expanded
    assert result.hello["quant"] == "q4_0"
    ref = Reference(plan, art.weights.read_bytes()).generate(PROMPT, 24, SAMPLED, stop_at_eos=False)
    assert result.tokens == ref.tokens
    assert result.digests == ref.digests


def test_q4_0_image_is_smaller_than_q8_0():
    spec = load_model(DEFAULT_MODEL, load_tensors=False).spec
    host = load_board("host")
    q8, q4 = (plan_for_board(spec, host, quant, 128) for quant in ("q8_0", "q4_0"))
    assert q4.image.data_bytes < 0.6 * q8.image.data_bytes
    assert [t.dtype for t in q4.tensors if t.rows > 1] == ["q4_0"] * sum(t.rows > 1 for t in q4.tensors)


def test_the_plan_expands_q4_0_only_where_the_board_has_room():
    spec = load_model(DEFAULT_MODEL, load_tensors=False).spec
    rv32 = load_board("qemu-rv32")
    roomy = plan_for_board(spec, rv32, "q4_0", 128)
    assert roomy.expand_q4 and roomy.expanded_bytes >= sum(t.rows * t.cols for t in roomy.tensors if t.dtype == "q4_0")
    # The same board with a RAM region one byte too small for the expanded copy: read in place.
    ram = rv32.region_holding("expanded_weights")
    in_place = make_plan(spec, "qemu-rv32", "q4_0", 128, rv32.prefill_batch)
    used = next(u.used for u in planned_use(rv32, in_place) if u.name == ram.name)
    tight = replace(ram, size=used + roomy.expanded_bytes - 1)
    small = replace(rv32, memory=(tight,) + rv32.memory[1:])
    assert not plan_for_board(spec, small, "q4_0", 128).expand_q4
    assert plan_for_board(
        spec, replace(rv32, memory=(replace(tight, size=tight.size + 1),) + rv32.memory[1:]), "q4_0", 128
    ).expand_q4
    # Boards without such a region (weights already in RAM, or a Linux process) never expand.
    assert not plan_for_board(spec, load_board("esp32p4"), "q4_0", 128).expand_q4
    assert not plan_for_board(spec, load_board("host"), "q4_0", 128).expand_q4


def test_report_says_how_q4_0_weights_are_read(builder):
    art, plan = builder.build(DEFAULT_MODEL, "q4_0", 128, "qemu-rv32")[1:]
    done = run_cli(
        "report", "--board", "qemu-rv32", "--model", DEFAULT_MODEL, "--quant", "q4_0", "--ctx", 128, "--json"
    )
    assert done.returncode == 0, done.stderr
    rep = json.loads(done.stdout)
    assert rep["q4_0_weights"].startswith("expanded to int8")
    ram = next(r for r in rep["regions"] if r["name"] == "ram")
    assert ram["items"]["expanded_weights"] == plan.expanded_bytes > 0


def test_a_prompt_longer_than_one_batch_gives_the_reference_bits(builder):
    prompt = (PROMPT * 9)[:75]  # 64 + 11 on host: two batches, the second one short
    art, plan, request, result = builder.run(DEFAULT_MODEL, prompt, 8, ctx=128, sampling=SAMPLED)
    assert plan.prefill_batch == 64
    ref = Reference(plan, art.weights.read_bytes()).generate(prompt, 8, SAMPLED, stop_at_eos=False)
    assert result.digests == ref.digests


def test_a_sliding_window_smaller_than_the_batch_gives_the_reference_bits(builder, checkpoints):
    # Window 8, a 13-token prompt in one batch: each token must see its own eight positions while
    # later tokens of the batch are still to be written into the ring.
    model = checkpoints("mistral_window")
    prompt = [3, 7, 11, 2, 9, 4, 15, 1, 8, 6, 12, 5, 10]
    art, plan, request, result = builder.run(model, prompt, 10, ctx=32)
    assert plan.kv_slots[0] < len(prompt) <= plan.prefill_batch
    ref = Reference(plan, art.weights.read_bytes()).generate(prompt, 10, SamplingParams(), stop_at_eos=False)
    assert result.digests == ref.digests


# Rows of 10 and 27 blocks: more than the reduction tree's 8 partials (docs/numerics.md), which the
# bundled model's rows (2 and 4 blocks) never reach; a 21-token prompt fills two groups of eight
# tokens of the batched kernels and part of a third.
WIDE = (
    "LlamaConfig",
    "LlamaForCausalLM",
    dict(
        vocab_size=512,
        hidden_size=320,
        intermediate_size=864,
        num_hidden_layers=2,
        num_attention_heads=5,
        num_key_value_heads=1,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    ),
)
WIDE_PROMPT = ",".join(str((i * 37 + 3) % 512) for i in range(21))


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory):
    from models import make_checkpoint

    return make_checkpoint(WIDE, tmp_path_factory.mktemp("wide") / "wide", seed=18)


@pytest.mark.parametrize(
    "board,quant,threads",
    [
        ("host", "q8_0", 1),
        ("host", "q8_0", 2),
        ("host", "q4_0", 1),
        ("host", "q4_0", 2),
        ("linux-aarch64", "q8_0", 2),
        ("linux-aarch64", "q4_0", 1),
        ("qemu-rv32", "q8_0", 1),
        ("qemu-rv32", "q4_0", 1),
    ],
)
def test_rows_longer_than_the_reduction_tree_decode_the_reference_bits(wide_model, board, quant, threads, tmp_path):
    done = run_cli(
        "verify",
        "--board",
        board,
        "--model",
        wide_model,
        "--quant",
        quant,
        "--threads",
        threads,
        "--prompt-ids",
        WIDE_PROMPT,
        "--steps",
        8,
        "--ctx",
        64,
        "--out",
        tmp_path / "build",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS" in done.stdout
