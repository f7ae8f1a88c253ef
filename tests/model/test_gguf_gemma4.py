"""Gemma 4 from GGUF (llama.cpp's gemma4): the checkpoints of tests/models.py "gemma4_text" (per-layer
inputs, k_eq_v global layers of their own width) and "gemma4_moe" (the MoE block), converted by the
peer's own convert_hf_to_gguf.py, import to the same ModelSpec and bit-identical tensors as their
safetensors (the proportional RoPE read back from rope_freqs, the experts' gate and up split from
one stacked tensor), and the Q8_0 file's firmware keeps its blocks and decodes the reference's
bits. Damaged gemma4 keys are refused in one line."""

import dataclasses
import struct

import pytest
from gguf_files import assert_damaged_key_refused, assert_imports_alike

from generator.model.gguf.load import load_gguf
from generator.model.load import load_model
from generator.numerics.sampling import SamplingParams
from generator.verify import compare, reference_run

pytestmark = pytest.mark.slow  # the peer's converter runs five times, firmware is built (about 60 s)

PROMPT = [1, 17, 42, 99, 7, 3, 250]
KINDS = ("gemma4_text", "gemma4_moe")


@pytest.fixture(scope="module")
def gemma4_peer(tmp_path_factory):
    """Each kind at vocab 512 (kjv-tiny's tokenizer, which the converter needs) and its .gguf files
    as llama.cpp writes them, f32 and q8_0."""
    from gguf_files import peer_convert

    from models import ORACLE_CONFIGS, make_checkpoint

    out = {}
    for kind in (*KINDS, "gemma4_kv_shared"):
        config_cls, model_cls, kwargs = ORACLE_CONFIGS[kind]
        kwargs = dict(kwargs, vocab_size=512)
        if kwargs.get("hidden_size_per_layer_input"):
            kwargs["vocab_size_per_layer_input"] = 512
        root = tmp_path_factory.mktemp(kind + "-peer")
        model_dir = make_checkpoint((config_cls, model_cls, kwargs), root / "model")
        types = ("f32",) if kind == "gemma4_kv_shared" else ("f32", "q8_0")
        out[kind] = model_dir, {t: peer_convert(model_dir, root / f"{kind}-{t}.gguf", t) for t in types}
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_converted_by_llama_cpp_imports_as_its_safetensors_do(kind, gemma4_peer):
    model_dir, files = gemma4_peer[kind]
    from_hf, from_gguf = load_model(model_dir), load_model(files["f32"])
    spec = from_hf.spec
    assert spec.global_head_dim == 32 and spec.global_kv_heads == 1 and spec.k_eq_v
    assert spec.rope.scaling == "proportional" and spec.rope.rotated_fraction == 0.25
    assert_imports_alike(from_hf, from_gguf)
    q8 = load_gguf(files["q8_0"])
    assert dataclasses.replace(q8.spec, name=spec.name) == spec


def test_kv_sharing_layers_and_their_double_wide_ffns_import_as_their_safetensors_do(gemma4_peer):
    """attention.shared_kv_layers, and feed_forward_length per layer (twice on those layers)."""
    model_dir, files = gemma4_peer["gemma4_kv_shared"]
    from_hf, from_gguf = load_model(model_dir), load_model(files["f32"])
    assert from_hf.spec.kv_shared_layers == 2 and from_hf.spec.double_wide_mlp
    assert_imports_alike(from_hf, from_gguf)


@pytest.mark.parametrize("kind", KINDS)
def test_firmware_from_the_q8_0_gguf_keeps_its_blocks_and_decodes_the_reference_bits(kind, gemma4_peer, builder):
    _, files = gemma4_peer[kind]
    sampling = SamplingParams(0.9, top_k=40, top_p=0.95, seed=11)
    art, plan, request, result = builder.run(files["q8_0"], PROMPT, 10, quant="gguf", sampling=sampling)
    assert compare(result, reference_run(plan, art.weights, request)).passed
    exact, _ = plan.gguf_kept()
    assert {"layers.2.wk" if kind == "gemma4_text" else "layers.1.wk", "layers.0.wq"} <= set(exact)
    if kind == "gemma4_moe":  # the experts' gate and up: rows of the stacked tensor, blocks kept
        assert {"layers.0.experts.3.w_gate", "layers.0.experts.3.w_up", "layers.0.experts.3.w_down"} <= set(exact)
    else:
        assert "ple_embed" in exact and plan.paged_table.dtype == "q8_0"


# llama.cpp's gemma4 keys, damaged: one line each, nothing built.
HOSTILE_KEYS = {
    "every layer sharing keys and values": (
        "gemma4.attention.shared_kv_layers",
        6,
        "layer 0 shares keys and values, but no earlier layer is of its kind",
    ),
    "more sharing layers than layers": (
        "gemma4.attention.shared_kv_layers",
        7,
        "attention.shared_kv_layers 7 exceeds the 6 layers",
    ),
    "no sliding head width": (
        "gemma4.attention.key_length_swa",
        None,
        "missing metadata 'gemma4.attention.key_length_swa'",
    ),
    "value width differs": ("gemma4.attention.value_length", 16, "attention key and value lengths differ"),
    "rope dims not the head": (
        "gemma4.rope.dimension_count_swa",
        8,
        "metadata 'gemma4.rope.dimension_count_swa' must be the head width 16",
    ),
    "one KV head count for all": ("gemma4.attention.head_count_kv", 3, "is not divisible by the layers' KV heads"),
    "per-layer width the tensors do not have": ("gemma4.embedding_length_per_layer_input", 16, "the metadata implies"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_KEYS))
def test_damaged_gemma4_keys_are_refused_in_one_line(case, gemma4_peer, tmp_path, capsys):
    assert_damaged_key_refused(capsys, gemma4_peer["gemma4_text"][1]["f32"], HOSTILE_KEYS[case], tmp_path)


def test_a_rope_freqs_tensor_that_is_not_proportional_is_refused(gemma4_peer, tmp_path, capsys):
    """rope_freqs must be 1 for each rotated pair, then 1e30: anything else names the tensor."""
    import gguf as gg

    from generator.cli import main

    src = gg.GGUFReader(str(gemma4_peer["gemma4_text"][1]["f32"]))
    path = tmp_path / "damaged.gguf"
    data = bytearray(src.data)
    freqs = next(t for t in src.tensors if t.name == "rope_freqs.weight")
    start = int(freqs.data_offset)
    data[start : start + 4] = struct.pack("<f", 0.5)  # the first pair's factor
    path.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["build", "--model", str(path), "--out", str(tmp_path / "out")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "tensor 'rope_freqs.weight' must hold 16 factors" in err[0], err
