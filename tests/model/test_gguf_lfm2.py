"""LFM2 from GGUF (llama.cpp's lfm2): the checkpoint of tests/models.py "lfm2" as llama.cpp's own
convert_hf_to_gguf.py writes it (the peer sdist's: head_count_kv 0 for the convolution layers,
shortconv.l_cache, the squeezed taps, the final norm as token_embd_norm) imports to the same ModelSpec
and bit-identical tensors as its safetensors, and its firmware decodes the reference's bits from the
Q8_0 blocks kept as the file holds them."""

import dataclasses

import numpy as np
import pytest

from generator.model.load import load_model
from generator.numerics.sampling import SamplingParams
from generator.verify import compare, reference_run

pytestmark = pytest.mark.slow  # llama.cpp's converter runs twice, a firmware is built and run

PROMPT = [1, 17, 42, 99, 7, 3, 250]


@pytest.fixture(scope="module")
def lfm2_peer(tmp_path_factory):
    """The checkpoint kind with kjv-tiny's vocabulary of 512 (the converter needs a tokenizer),
    converted to f32 and q8_0."""
    from gguf_files import peer_convert

    from models import ORACLE_CONFIGS, make_checkpoint

    config_cls, model_cls, kwargs = ORACLE_CONFIGS["lfm2"]
    root = tmp_path_factory.mktemp("lfm2-peer")
    model = make_checkpoint((config_cls, model_cls, dict(kwargs, vocab_size=512)), root / "model")
    return model, {t: peer_convert(model, root / f"lfm2-{t}.gguf", t) for t in ("f32", "q8_0")}


def test_llama_cpps_converter_output_imports_to_the_same_spec_and_tensors(lfm2_peer):
    model, files = lfm2_peer
    hf, gguf = load_model(model), load_model(files["f32"])
    assert hf.spec.short_conv_layers == (True, False, True, False) and hf.spec.short_conv_kernel == 3
    assert dataclasses.replace(gguf.spec, name=hf.spec.name) == hf.spec
    assert list(gguf.tensors) == list(hf.tensors)
    for name in hf.tensors:
        a, b = hf.tensors[name].load(), gguf.tensors[name].load()
        assert a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32)), name


def test_firmware_from_the_q8_0_gguf_keeps_its_blocks_and_decodes_the_reference_bits(lfm2_peer, builder):
    _, files = lfm2_peer
    sampling = SamplingParams(0.9, top_k=40, top_p=0.95, seed=11)
    art, plan, request, result = builder.run(files["q8_0"], PROMPT, 12, quant="gguf", sampling=sampling)
    assert compare(result, reference_run(plan, art.weights, request)).passed
    exact, _ = plan.gguf_kept()
    assert {"layers.0.conv_in", "layers.0.conv_out", "layers.1.wq", "layers.1.w_down"} <= set(exact)
