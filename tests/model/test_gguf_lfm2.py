"""LFM2 and LFM2-MoE from GGUF (llama.cpp's lfm2, lfm2moe): the checkpoints of tests/models.py "lfm2"
and "lfm2_moe" as llama.cpp's own convert_hf_to_gguf.py writes them (the peer sdist's: head_count_kv
0 for the convolution layers, shortconv.l_cache, the squeezed taps, the final norm as
token_embd_norm; the MoE's stacked experts, exp_probs_b, leading_dense_block_count, the sigmoid
gating function) import to the same ModelSpec and bit-identical tensors as their safetensors, and
their firmware decodes the reference's bits from the Q8_0 blocks kept as the files hold them."""

import dataclasses

import numpy as np
import pytest

from generator.model.load import load_model
from generator.numerics.sampling import SamplingParams
from generator.verify import compare, reference_run

pytestmark = pytest.mark.slow  # llama.cpp's converter runs twice, a firmware is built and run

PROMPT = [1, 17, 42, 99, 7, 3, 250]


@pytest.fixture(scope="module")
def peer_files(tmp_path_factory):
    """kind -> (the checkpoint with kjv-tiny's vocabulary; its f32 and q8_0 files). LFM2-MoE's
    routed scaling 1: llama.cpp's converter does not write it."""
    from gguf_files import peer_checkpoints

    return peer_checkpoints(
        lambda kind: tmp_path_factory.mktemp(f"{kind}-peer"),
        lambda kind: {"routed_scaling_factor": 1.0} if kind == "lfm2_moe" else {},
    )


@pytest.mark.parametrize("kind", ["lfm2", "lfm2_moe"])
def test_llama_cpps_converter_output_imports_to_the_same_spec_and_tensors(kind, peer_files):
    model, files = peer_files(kind)
    hf, gguf = load_model(model), load_model(files["f32"])
    assert hf.spec.short_conv_layers == (True, False, True, False) and hf.spec.short_conv_kernel == 3
    assert dataclasses.replace(gguf.spec, name=hf.spec.name) == hf.spec
    assert list(gguf.tensors) == list(hf.tensors)
    for name in hf.tensors:
        a, b = hf.tensors[name].load(), gguf.tensors[name].load()
        assert a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32)), name


@pytest.mark.parametrize(
    "kind, kept",
    [
        ("lfm2", "layers.0.conv_in layers.0.conv_out layers.1.wq layers.1.w_down"),
        ("lfm2_moe", "layers.0.conv_in layers.2.experts.5.w_down"),
    ],
)
def test_firmware_from_the_q8_0_gguf_keeps_its_blocks_and_decodes_the_reference_bits(kind, kept, peer_files, builder):
    _, files = peer_files(kind)
    sampling = SamplingParams(0.9, top_k=40, top_p=0.95, seed=11)
    art, plan, request, result = builder.run(files["q8_0"], PROMPT, 12, quant="gguf", sampling=sampling)
    assert compare(result, reference_run(plan, art.weights, request)).passed
    exact, _ = plan.gguf_kept()
    assert set(kept.split()) <= set(exact)
