"""--quant gguf: a GGUF file's Q8_0, Q4_0 and Q4_1 blocks go into the weight image as they are,
value for value (their binary16 scales and minimums are what the image stores), and decode bit
for bit as the NumPy reference does on every board (the types kept verbatim, Q5_0 to MXFP4:
test_gguf_kept_blocks.py); other block types are quantized again and the build says so, per
tensor, with the error."""

import json
from dataclasses import replace

import numpy as np
import pytest
from cli_runs import verify_passes
from conftest import run_cli
from gguf_files import hf_to_gguf

from generator.compile.image import map_image, read_header
from generator.model.gguf.load import load_gguf
from generator.numerics.quantize import dequantize_q4_1, dequantize_q8_0, unpack_q4_0, unpack_q4_1
from models import ORACLE_CONFIGS, make_checkpoint

pytestmark = pytest.mark.slow  # builds GGUF files of every family and verifies them

MODELS = {
    "llama": ORACLE_CONFIGS["llama_gqa_linear"],
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(ORACLE_CONFIGS["mixtral_moe"][2], sliding_window=None)),
    # rows of 256 and 512 values, for the block types of 256 that are quantized again (TQ2_0)
    "wide-llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(ORACLE_CONFIGS["llama_gqa_linear"][2], hidden_size=256, intermediate_size=512, num_attention_heads=4),
    ),
}


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("kept")
    made = {}

    def get(kind: str, tensor_type: str):
        if kind not in made:
            made[kind] = make_checkpoint(MODELS[kind], root / kind)
        if (kind, tensor_type) not in made:
            made[kind, tensor_type] = hf_to_gguf(made[kind], root / f"{kind}-{tensor_type}.gguf", tensor_type)
        return made[kind, tensor_type]

    return get


def build(path, out, board="host"):
    done = run_cli("build", "--board", board, "--model", path, "--quant", "gguf", "--ctx", "64", "--out", out)
    assert done.returncode == 0, done.stderr
    return out / "generated", done.stderr


def image_values(image, t) -> np.ndarray:
    """A tensor's values as the image holds them (block type by block type)."""
    start = read_header(image).data_offset + t.offset
    nb = t.rows * t.cols // 32
    d = np.frombuffer(image, "<f2", nb, start + t.scales_offset).reshape(t.rows, -1)
    if t.dtype == "q8_0":
        return dequantize_q8_0(np.frombuffer(image, np.int8, t.rows * t.cols, start).reshape(t.rows, -1), d)
    packed = np.frombuffer(image, np.uint8, t.rows * t.cols // 2, start).reshape(t.rows, -1)
    if t.dtype == "q4_0":
        return dequantize_q8_0(unpack_q4_0(packed), d)
    m = np.frombuffer(image, "<f2", nb, start + t.mins_offset).reshape(t.rows, -1)
    return dequantize_q4_1(unpack_q4_1(packed), d, m)


@pytest.mark.parametrize("tensor_type,block_type", [("Q8_0", "q8_0"), ("Q4_0", "q4_0"), ("Q4_1", "q4_1")])
def test_the_files_blocks_are_kept_value_for_value(gguf_file, tmp_path, tensor_type, block_type):
    path = gguf_file("llama", tensor_type)
    generated, _ = build(path, tmp_path / "out")
    plan = json.loads((generated / "plan.json").read_text())
    assert plan["quant"] == "gguf" and plan["gguf"]["quantized_again"] == []
    assert len(plan["gguf"]["exact"]) == len(plan["tensors"])
    image = map_image(generated / "weights.img")
    tensors = load_gguf(path).tensors
    from generator.compile.layout import TensorEntry

    for entry in plan["tensors"]:
        t = TensorEntry(**entry)
        if t.dtype != "f32":
            assert t.dtype == block_type
            file_values = tensors[t.name].load().reshape(t.rows, t.cols)
            assert np.array_equal(image_values(image, t).view(np.uint32), file_values.view(np.uint32)), t.name


@pytest.mark.parametrize("board", ["host", "linux-aarch64", "qemu-rv32"])
@pytest.mark.parametrize("kind", ["llama", "mixtral"])
def test_kept_q4_1_blocks_decode_as_the_reference_on_every_board(gguf_file, tmp_path, kind, board):
    path = gguf_file(kind, "Q4_1")
    verify_passes(
        tmp_path / "out", timeout=900, board=board, model=path, quant="gguf", ctx=64, prompt_ids="1,5,9,30", steps=6,
        temperature=0.8, seed=3, ignore_eos=True,
    )  # fmt: skip


def test_other_block_types_are_quantized_again_and_the_build_says_by_how_much(gguf_file, tmp_path):
    generated, stderr = build(gguf_file("wide-llama", "TQ2_0"), tmp_path / "out")
    plan = json.loads((generated / "plan.json").read_text())
    again = plan["gguf"]["quantized_again"]
    assert again and {a["file_type"] for a in again} == {"TQ2_0"} and {a["block_type"] for a in again} == {"q4_1"}
    for a in again:
        assert f"note: {a['tensor']} (TQ2_0 in the file) quantized again to q4_1: largest error" in stderr
    assert "tensors kept exactly as the GGUF file holds them" in stderr and "quantized again: " in stderr


def test_gguf_quant_needs_a_gguf_file(tmp_path):
    from conftest import DEFAULT_MODEL

    done = run_cli("build", "--model", DEFAULT_MODEL, "--quant", "gguf", "--out", tmp_path / "out")
    assert done.returncode == 2 and "--quant gguf keeps a GGUF file's own blocks" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_report_says_which_tensors_are_exact(gguf_file, tmp_path):
    path = gguf_file("wide-llama", "TQ2_0")
    done = run_cli("report", "--model", path, "--quant", "gguf", "--ctx", "64", "--out", tmp_path / "out", "--json")
    assert done.returncode == 0, done.stderr
    rep = json.loads(done.stdout)["gguf"]
    assert (
        rep["exact"]
        and rep["quantized_again"]
        and rep["summary"].endswith(f"quantized again: {len(rep['quantized_again'])} TQ2_0 to q4_1")
    )
    text = run_cli("report", "--model", path, "--quant", "gguf", "--ctx", "64", "--out", tmp_path / "out").stdout
    assert "tensors kept exactly as the GGUF file holds them" in text and "quantized again: layers.0.wq (TQ2_0" in text


def small_spec(**changes):
    """A one-layer llama ModelSpec for plans made without a checkpoint; `changes` replace its fields."""
    from generator.model.spec import ModelSpec, RopeSpec

    spec = ModelSpec(
        name="small", architecture="LlamaForCausalLM", family="llama", vocab_size=64, hidden_size=32,
        intermediate_size=64, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, rms_norm_eps=1e-6,
        rope=RopeSpec(theta=10000.0), max_position_embeddings=128, tie_embeddings=False, qkv_bias=False,
        o_bias=False, mlp_bias=False, qk_norm=False, layer_windows=(0,),
    )  # fmt: skip
    return replace(spec, **changes)


def test_a_plan_of_tens_of_thousands_of_tensors_says_what_it_kept_in_linear_time():
    """A 30 B MoE has 18,867 tensors: the plan's GGUF summary and its JSON (written by every build)
    look each tensor up by name, which took 52 s and 59 s there while it scanned the whole list per
    name. 40,000 tensors must take a moment, not the quarter of an hour a scan per name would."""
    import time

    from generator.compile.plan import make_plan
    from generator.model.spec import expected_shapes

    # 4,000 experts in each of 3 layers: 36,000 expert tensors and a few more.
    spec = small_spec(
        name="wide-moe", architecture="Qwen3MoeForCausalLM", family="qwen3", intermediate_size=32, n_layers=3,
        max_position_embeddings=64, qk_norm=True, layer_windows=(0, 0, 0), n_experts=4000, experts_per_token=2,
        expert_intermediate_size=32, norm_topk_prob=True, moe_layers=(True, True, True),
    )  # fmt: skip
    names = list(expected_shapes(spec))
    assert len(names) > 36_000
    plan = make_plan(spec, "host", "gguf", 64, gguf_types={n: "F32" if n.endswith("norm") else "Q8_0" for n in names})
    start = time.monotonic()
    summary, plan_json = plan.gguf_summary(), plan.to_json()
    assert time.monotonic() - start < 20
    assert summary.startswith(f"{len(names)} of {len(names)} tensors kept exactly")
    assert json.loads(plan_json)["gguf"]["summary"] == summary


def test_without_quant_a_gguf_file_keeps_its_blocks_and_a_checkpoint_is_built_q8_0(gguf_file, tmp_path):
    """No --quant: a GGUF file is built with its own numbers (gguf), not re-rounded to q8_0."""
    from conftest import DEFAULT_MODEL

    from generator.boards import load_board
    from generator.compile.build import prepare

    host = load_board("host")
    request, plan = prepare(host, gguf_file("llama", "Q4_1"), None, 64, tmp_path / "gguf")
    assert (request.quant, plan.quant) == ("gguf", "gguf")
    assert {plan.tensor(name).dtype for name, kind in plan.gguf_types if kind == "Q4_1"} == {"q4_1"}
    request, plan = prepare(host, DEFAULT_MODEL, None, 64, tmp_path / "hf")
    assert (request.quant, plan.quant, plan.gguf_types) == ("q8_0", "q8_0", ())


@pytest.mark.parametrize(
    "file_types, line",
    [
        ({}, "writing 12 tensors as the GGUF file holds them, none quantized again"),
        ({"layers.0.wq": "TQ2_0"}, "writing 12 tensors: 11 as the GGUF file holds them, 1 quantized again to q4_1"),
    ],
)
def test_the_generation_line_says_a_gguf_files_blocks_are_kept_not_quantized(file_types, line):
    from generator.compile.pipeline import generation_line
    from generator.compile.plan import make_plan
    from generator.model.spec import expected_shapes

    spec = small_spec()
    names = list(expected_shapes(spec))
    kept = {n: "F32" if n.endswith("norm") else "Q8_0" for n in names}
    plan = make_plan(spec, "host", "gguf", 64, gguf_types={**kept, **file_types})
    assert generation_line(plan).startswith(line)
    q8 = make_plan(spec, "host", "q8_0", 64)
    assert generation_line(q8).startswith(f"quantizing {len(names)} tensors to q8_0 (")
