"""q4_1 weights (affine 4-bit: d * q + m per block of 32) on every board: the image holds quants,
scales and minimums, every board reads them in place, and dense and MoE models decode the
reference's bits, greedy and sampled, at one and two threads."""

import json

import pytest
from conftest import DEFAULT_MODEL, run_cli

from generator.boards import load_board
from generator.compile import image_format
from generator.compile.image import read_header
from generator.compile.plan import plan_for_board
from generator.model.load import load_model
from generator.numerics.quantize import quantize_q4_1
from generator.numerics.sampling import SamplingParams
from generator.reference import Reference

pytestmark = pytest.mark.slow  # builds and verifies q4_1 firmware on the emulated boards

PROMPT = [1, 21, 51, 68, 104, 44, 74, 51, 100]  # "In the beginning"
SAMPLED = SamplingParams(0.8, top_k=40, top_p=0.95, seed=5)
GREEDY = SamplingParams()
BOARDS = ("host", "linux-aarch64", "qemu-rv32")


def assert_reference_bits(art, plan, result, prompt, steps, sampling):
    ref = Reference(plan, art.weights.read_bytes()).generate(prompt, steps, sampling, stop_at_eos=False)
    assert result.tokens == ref.tokens
    assert result.digests == ref.digests
    return ref


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("board", BOARDS)
def test_q4_1_decodes_the_reference_bits_on_every_board(board, sampling, builder):
    art, plan, request, result = builder.run(
        DEFAULT_MODEL, PROMPT, 24, quant="q4_1", ctx=128, sampling=sampling, board=board
    )
    assert result.hello["quant"] == "q4_1"
    assert not plan.expand_q4 and plan.q4_1_weights == "read in place by the q4_1 kernels"
    assert_reference_bits(art, plan, result, PROMPT, 24, sampling)


@pytest.mark.parametrize("board", BOARDS)
def test_a_q4_1_mixture_of_experts_decodes_the_reference_bits_and_routing(board, checkpoints, builder):
    model = checkpoints("qwen2_moe_shared")
    prompt = [1, 17, 33, 90, 5]
    art, plan, request, result = builder.run(model, prompt, 16, quant="q4_1", sampling=SAMPLED, board=board)
    assert {t.dtype for t in plan.tensors if ".experts." in t.name} == {"q4_1"}
    ref = assert_reference_bits(art, plan, result, prompt, 16, SAMPLED)
    assert result.expert_counts == ref.expert_counts


@pytest.mark.parametrize("threads", [1, 2])
def test_verify_passes_for_q4_1_with_one_and_two_threads(threads, tmp_path):
    done = run_cli(
        "verify",
        "--board",
        "host",
        "--quant",
        "q4_1",
        "--ctx",
        64,
        "--prompt",
        "And God said",
        "--steps",
        12,
        "--threads",
        threads,
        "--out",
        tmp_path / "b",
    )
    assert done.returncode == 0, done.stderr
    assert "PASS" in done.stdout and "(q4_1," in done.stdout


def test_q4_1_image_holds_quants_then_scales_then_minimums():
    spec = load_model(DEFAULT_MODEL, load_tensors=False).spec
    host = load_board("host")
    q8, q4_0, q4_1 = (plan_for_board(spec, host, quant, 128) for quant in ("q8_0", "q4_0", "q4_1"))
    assert q4_0.image.data_bytes < q4_1.image.data_bytes < 0.7 * q8.image.data_bytes
    for t in q4_1.tensors:
        if t.rows == 1:
            assert t.dtype == "f32"
            continue
        blocks = t.rows * t.cols // 32
        assert t.dtype == "q4_1"
        assert t.scales_offset == -(-t.rows * t.cols // 2 // 64) * 64
        assert t.mins_offset == t.scales_offset + 2 * blocks and t.nbytes == t.mins_offset + 2 * blocks
    assert image_format.DTYPE_CODES["q4_1"] == 3
    # MCU boards read q4_1 in place even where q4_0 is expanded to int8 at load
    rv32 = load_board("qemu-rv32")
    assert plan_for_board(spec, rv32, "q4_0", 128).expand_q4
    assert not plan_for_board(spec, rv32, "q4_1", 128).expand_q4


def test_the_q4_1_image_holds_what_quantize_q4_1_gives(builder):
    art, plan = builder.build(DEFAULT_MODEL, "q4_1", 64, "host")[1:]
    image = art.weights.read_bytes()
    header = read_header(image)
    t = plan.tensor("layers.0.wq")
    start = header.data_offset + t.offset
    tensors = load_model(DEFAULT_MODEL).tensors
    packed, d, m = quantize_q4_1(tensors["layers.0.wq"].load())
    nb = t.rows * t.cols // 32
    assert image[start : start + packed.size] == packed.tobytes()
    assert image[start + t.scales_offset : start + t.scales_offset + 2 * nb] == d.astype("<f2").tobytes()
    assert image[start + t.mins_offset : start + t.mins_offset + 2 * nb] == m.astype("<f2").tobytes()


def test_report_and_plan_json_name_q4_1(builder):
    art = builder.build(DEFAULT_MODEL, "q4_1", 128, "qemu-rv32")[1]
    plan = json.loads(art.plan_json.read_text())
    assert plan["quant"] == "q4_1" and plan["q4_1_weights"] == "read in place by the q4_1 kernels"
    assert {t["dtype"] for t in plan["tensors"] if t["rows"] > 1} == {"q4_1"}
    done = run_cli(
        "report", "--board", "qemu-rv32", "--model", DEFAULT_MODEL, "--quant", "q4_1", "--ctx", 128, "--json"
    )
    assert done.returncode == 0, done.stderr
    rep = json.loads(done.stdout)
    assert rep["quant"] == "q4_1" and rep["q4_1_weights"] == "read in place by the q4_1 kernels"
    assert rep["q4_0_weights"] is None
    text = run_cli("report", "--board", "qemu-rv32", "--model", DEFAULT_MODEL, "--quant", "q4_1", "--ctx", 128).stdout
    assert "q4_1 weights: read in place by the q4_1 kernels" in text
