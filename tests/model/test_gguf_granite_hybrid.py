"""Granite 4.0 hybrid from GGUF (llama.cpp's granitehybrid): the checkpoints of tests/models.py
"granite_hybrid" and "granite_hybrid_moe" as llama.cpp's own convert_hf_to_gguf.py writes them (the
peer sdist's: head_count_kv 0 for the Mamba-2 layers, the ssm.* keys, A as -exp(A_log), the squeezed
taps, the norm per group, the multipliers as *_scale keys, the shared MLP as ffn_* without experts
and *_shexp beside them, permuted q/k rows) import to the same ModelSpec and bit-identical tensors as
their safetensors, and their firmware decodes the reference's bits from the Q8_0 blocks kept as the
file holds them. The converter writes no RoPE for the hybrids (rope.scaling.finetuned false), a
context of 2^20 and no time_step_limit: the checkpoints are made without RoPE or a dt limit."""

import dataclasses

import pytest
from gguf_files import assert_same_tensors

from generator.model.load import load_model
from generator.numerics.sampling import SamplingParams
from generator.verify import compare, reference_run

pytestmark = pytest.mark.slow  # llama.cpp's converter runs twice per checkpoint, a firmware is built and run

PROMPT = [1, 17, 42, 99, 7, 3, 250]


@pytest.fixture(scope="module")
def peer_files(tmp_path_factory):
    """kind -> (the checkpoint with kjv-tiny's vocabulary, its layer_types under the names the
    published checkpoints and llama.cpp's converter use; its f32 and q8_0 files)."""
    from gguf_files import peer_checkpoints

    def converter_layer_names(config: dict) -> None:
        config["layer_types"] = ["mamba" if t == "linear_attention" else "attention" for t in config["layer_types"]]

    return peer_checkpoints(
        lambda kind: tmp_path_factory.mktemp(f"{kind}-peer"),
        lambda kind: {"position_embedding_type": None, "time_step_limit": (0.0, float("inf"))},
        converter_layer_names,
    )


@pytest.mark.parametrize("kind", ["granite_hybrid", "granite_hybrid_moe"])
def test_llama_cpps_converter_output_imports_to_the_same_spec_and_tensors(kind, peer_files):
    model, files = peer_files(kind)
    hf, gguf = load_model(model), load_model(files["f32"])
    assert hf.spec.mamba_layers == (True, False, True, False) and hf.spec.residual_scale == 0.7
    assert gguf.spec.max_position_embeddings == 2**20  # (the converter's context for models without RoPE)
    same = dataclasses.replace(gguf.spec, name=hf.spec.name, max_position_embeddings=hf.spec.max_position_embeddings)
    assert same == hf.spec
    assert_same_tensors(hf, gguf)


def test_firmware_from_the_q8_0_gguf_keeps_its_blocks_and_decodes_the_reference_bits(peer_files, builder):
    _, files = peer_files("granite_hybrid_moe")
    sampling = SamplingParams(0.9, top_k=40, top_p=0.95, seed=11)
    art, plan, request, result = builder.run(files["q8_0"], PROMPT, 12, quant="gguf", sampling=sampling)
    assert compare(result, reference_run(plan, art.weights, request)).passed
    exact, _ = plan.gguf_kept()
    assert {"layers.0.ssm_in", "layers.0.ssm_out", "layers.1.wq", "layers.2.experts.5.w_down"} <= set(exact)
