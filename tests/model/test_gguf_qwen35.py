"""Qwen3.5-MoE from GGUF (llama.cpp's qwen35moe): the checkpoint of tests/models.py "qwen3_5_moe"
written as llama.cpp's converter writes it (tests/gguf_files.py qwen35_hf_to_gguf: its value heads
reordered, -exp(A_log), the squeezed convolution, (1 + w) norms) imports to the same ModelSpec and
bit-identical tensors as its safetensors, and its firmware decodes the reference's bits from the
Q8_0 blocks kept as the file holds them. The same holds for the file llama.cpp's own converter writes
of such a checkpoint (the peer sdist's convert_hf_to_gguf.py)."""

import dataclasses

import pytest
from gguf_files import assert_damaged_key_refused, assert_imports_alike, assert_same_tensors, qwen35_hf_to_gguf

from generator.model.load import load_model
from generator.numerics.sampling import SamplingParams
from generator.verify import compare, reference_run

pytestmark = pytest.mark.slow  # GGUF files written, firmware built and run (about 20 s)

PROMPT = [1, 17, 42, 99, 7, 3, 250]


@pytest.fixture(scope="module")
def qwen35_gguf(checkpoints, tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen35-gguf")
    model = checkpoints("qwen3_5_moe")
    return model, {t: qwen35_hf_to_gguf(model, root / f"qwen35-{t}.gguf", t) for t in ("F32", "Q8_0")}


def test_gguf_imports_to_the_same_spec_and_tensors_as_the_safetensors(qwen35_gguf):
    model, files = qwen35_gguf
    assert_imports_alike(load_model(model), load_model(files["F32"]))


def test_firmware_from_the_q8_0_gguf_keeps_its_blocks_and_decodes_the_reference_bits(qwen35_gguf, builder):
    """(The F32 file's tensors are the safetensors' bit for bit, above: its firmware is theirs.)"""
    _, files = qwen35_gguf
    sampling = SamplingParams(0.9, top_k=40, top_p=0.95, seed=11)
    art, plan, request, result = builder.run(files["Q8_0"], PROMPT, 12, quant="gguf", sampling=sampling)
    assert compare(result, reference_run(plan, art.weights, request)).passed
    exact, _ = plan.gguf_kept()
    # The DeltaNet matrices whose rows llama.cpp reordered keep their Q8_0 blocks, reordered back.
    assert {"layers.0.lin_qkv", "layers.0.lin_z", "layers.0.lin_b", "layers.3.wq", "layers.3.wq_gate"} <= set(exact)


@pytest.fixture(scope="module")
def qwen35_peer(tmp_path_factory):
    """The same checkpoint kind (vocab 520: Qwen3.5's tokenizer class adds <|endoftext|> as id 512 to
    the kjv-tiny vocabulary the converter is given) as llama.cpp's own convert_hf_to_gguf.py writes
    it, f32 and q8_0; --no-mtp, as the checkpoint has no multi-token-prediction layers."""
    from gguf_files import peer_convert

    from models import ORACLE_CONFIGS, make_checkpoint

    config_cls, model_cls, kwargs = ORACLE_CONFIGS["qwen3_5_moe"]
    root = tmp_path_factory.mktemp("qwen35-peer")
    model = make_checkpoint((config_cls, model_cls, dict(kwargs, vocab_size=520)), root / "model")
    return model, {t: peer_convert(model, root / f"qwen35-{t}.gguf", t, "--no-mtp") for t in ("f32", "q8_0")}


def test_llama_cpps_converter_output_imports_to_the_same_spec_and_tensors(qwen35_peer):
    model, files = qwen35_peer
    hf, gguf = load_model(model), load_model(files["f32"])
    # The file's end-of-sequence ids are the tokenizer's too (the converter adds <|endoftext|>).
    assert gguf.spec.eos_token_ids == (2, 512)
    assert dataclasses.replace(gguf.spec, name=hf.spec.name, eos_token_ids=hf.spec.eos_token_ids) == hf.spec
    assert_same_tensors(hf, gguf)


def test_llama_cpps_q8_0_file_keeps_its_blocks_and_decodes_the_reference_bits(qwen35_peer, builder):
    _, files = qwen35_peer
    art, plan, request, result = builder.run(files["q8_0"], PROMPT, 12, quant="gguf")
    assert compare(result, reference_run(plan, art.weights, request)).passed
    exact, _ = plan.gguf_kept()
    assert {"layers.0.lin_qkv", "layers.0.lin_z", "layers.3.wq", "layers.3.wq_gate"} <= set(exact)
    assert {plan.tensor(n).dtype for n in exact if ".experts." in n} == {"q8_0"}


# llama.cpp's qwen35moe keys, damaged: one line each, nothing built.
HOSTILE_KEYS = {
    "no ssm.group_count": ("qwen35moe.ssm.group_count", None, "missing metadata 'qwen35moe.ssm.group_count'"),
    "zero key groups": ("qwen35moe.ssm.group_count", 0, "'qwen35moe.ssm.group_count' must be at least 1, got 0"),
    "value heads not a multiple of the groups": (
        "qwen35moe.ssm.time_step_rank",
        3,
        "ssm.time_step_rank 3 must be a multiple of ssm.group_count 2",
    ),
    "conv kernel 0": ("qwen35moe.ssm.conv_kernel", 0, "'qwen35moe.ssm.conv_kernel' must be at least 1, got 0"),
    "state size the tensors do not have": ("qwen35moe.ssm.state_size", 8, "the metadata implies"),
    "odd partial rotary dims": (
        "qwen35moe.rope.dimension_count",
        3,
        "rope.dimension_count 3 must be even and at most 16",
    ),
    "no experts": ("qwen35moe.expert_count", 0, "'qwen35moe.expert_count' must be at least 1, got 0"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_KEYS))
def test_damaged_qwen35moe_keys_are_refused_in_one_line(case, qwen35_gguf, tmp_path, capsys):
    assert_damaged_key_refused(capsys, qwen35_gguf[1]["F32"], HOSTILE_KEYS[case], tmp_path)
