"""Llama 4 text, a row of the family table (tests/models.py "llama4_text": RoPE layers 0 and 3
attending within chunks of 8 with their queries and keys L2-normalised, layers 1 and 2 without RoPE
seeing every position with their queries' temperature, layers 1 and 3 routing top-1 of 8 experts by
sigmoid weights that scale the experts' inputs, beside an ungated shared expert): its spec, what a
position of a chunked layer sees, the emulated boards decoding the reference's bits, and the
checkpoint as llama.cpp's own convert_hf_to_gguf.py writes it importing to the same spec and
tensors. tests/numerics/test_oracle.py checks the f32 firmware against transformers and q8_0
against the reference."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest
from cli_runs import assert_decodes_as_the_reference, run_prompt

from generator.model.hf.load import load_hf
from generator.model.load import load_model
from generator.model.spec import RopeSpec
from generator.numerics.sampling import SamplingParams

KIND = "llama4_text"
PROMPT = [1, 17, 42, 99, 7, 3, 250, 64, 5]  # with the decode, past two chunk boundaries (8, 16)
STEPS = 10
SAMPLED = SamplingParams(0.9, top_k=40, top_p=0.95, min_p=0.01, seed=7)


def test_the_rope_layers_are_chunked_and_every_second_layer_routes(checkpoints):
    spec = load_hf(checkpoints(KIND), load_tensors=False).spec
    assert spec.family == "llama4" and spec.chunked_windows and spec.layer_windows == (8, 0, 0, 8)
    assert spec.nope_layers == (False, True, True, False) and spec.qk_l2_norm_layers == (True, False, False, True)
    assert (spec.attn_temperature_floor, spec.attn_temperature_scale) == (8, 0.1) and not spec.qk_norm
    assert spec.moe_layers == (False, True, False, True) and spec.router == "topk_then_sigmoid"
    assert spec.expert_input_scaled and spec.ungated_shared_expert and not spec.norm_topk_prob
    assert (spec.intermediate_size, spec.expert_intermediate_size, spec.shared_expert_intermediate_size) == (96, 32, 32)


def test_a_position_of_a_chunked_layer_sees_its_own_chunk_only(checkpoints):
    spec = load_hf(checkpoints(KIND), load_tensors=False).spec
    positions = (0, 7, 8, 9, 15, 16, 30)
    assert [spec.first_seen(0, p) for p in positions] == [0, 0, 8, 8, 8, 16, 24]
    assert [spec.first_seen(1, p) for p in positions] == [0] * len(positions)  # a no-RoPE layer sees all


def test_the_text_tower_of_a_multimodal_checkpoint_imports_as_the_text_model(tmp_path):
    """A Llama4ForConditionalGeneration (a one-layer vision tower beside the text tower of
    "llama4_text", under text_config) imports as its language model saved alone: the same spec but
    for the class, the same tensors bit for bit, the vision tower and projector left out."""
    import torch
    import transformers

    from models import ORACLE_CONFIGS

    torch.manual_seed(3)
    text = dict(ORACLE_CONFIGS[KIND][2], initializer_range=0.1, bos_token_id=1, eos_token_id=2)
    vision = dict(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=28,
        patch_size=14, vision_output_dim=64, projector_input_dim=64, projector_output_dim=64,
    )  # fmt: skip
    model = transformers.Llama4ForConditionalGeneration(
        transformers.Llama4Config(text_config=text, vision_config=vision)
    )
    model.save_pretrained(tmp_path / "multimodal")
    model.language_model.save_pretrained(tmp_path / "text")
    tower, alone = load_model(tmp_path / "multimodal"), load_model(tmp_path / "text")
    assert tower.spec.architecture == "Llama4ForConditionalGeneration"
    assert dataclasses.replace(tower.spec, name=alone.spec.name, architecture=alone.spec.architecture) == alone.spec
    assert list(tower.tensors) == list(alone.tensors)
    assert all(np.array_equal(tower.tensors[n].load(), alone.tensors[n].load()) for n in alone.tensors)


@pytest.mark.slow  # runs under qemu-aarch64 (2 threads) and qemu-system-riscv32
@pytest.mark.parametrize("quant, board", [("q4_0", "linux-aarch64"), ("q8_0", "qemu-rv32")])
def test_emulated_boards_decode_the_reference_bits(quant, board, checkpoints, builder):
    b, art, plan = builder.build(checkpoints(KIND), quant, 32, board)
    request, result = run_prompt(b, art, PROMPT, STEPS, SAMPLED, threads=2 if board == "linux-aarch64" else 1)
    assert result.hello["board"] == board and len(result.tokens) == STEPS
    assert_decodes_as_the_reference(plan, art, request, result)


@pytest.mark.slow  # llama.cpp's converter runs once
def test_the_file_llama_cpp_converts_imports_as_its_safetensors_do(tmp_path):
    """llama.cpp's llama4 files hold no chunk size, no-RoPE layers or temperature: it fixes them
    (chunks of 8192, every fourth layer without RoPE, floor_scale 8192, attn_scale 0.1), so the
    checkpoint converted has those; its q/k rows are the checkpoint's (interleaved pairs)."""
    from gguf_files import peer_convert

    from models import ORACLE_CONFIGS, make_checkpoint

    config_cls, model_cls, kwargs = ORACLE_CONFIGS[KIND]
    as_llama_cpp = dict(attention_chunk_size=8192, floor_scale=8192, no_rope_layers=None)
    model_dir = make_checkpoint((config_cls, model_cls, dict(kwargs, vocab_size=512, **as_llama_cpp)), tmp_path / "m")
    from_hf, from_gguf = load_model(model_dir), load_model(peer_convert(model_dir, tmp_path / "llama4.gguf", "f32"))
    spec = from_hf.spec
    assert spec.layer_windows == (8192, 8192, 8192, 0) and spec.nope_layers == (False, False, False, True)
    assert dataclasses.replace(from_gguf.spec, name=spec.name) == spec
    assert list(from_gguf.tensors) == list(from_hf.tensors)
    differ = [
        n
        for n in from_hf.tensors
        if not np.array_equal(from_hf.tensors[n].load().view(np.uint32), from_gguf.tensors[n].load().view(np.uint32))
    ]
    assert differ == []


# Llama 4 Scout's rope_scaling (llama3: factor 16, low and high band factors both 1, a step where the
# wavelength passes original_max_position_embeddings), original shortened to 1,024 so that the tiny
# heads of 16 have pairs on both sides of it.
SCOUT_ROPE = dict(rope_type="llama3", factor=16.0, low_freq_factor=1.0, high_freq_factor=1.0,
                  original_max_position_embeddings=1024, rope_theta=500000.0)  # fmt: skip


@pytest.fixture(scope="module")
def scout_rope_gguf(tmp_path_factory):
    """The checkpoint with Scout's llama3 RoPE scaling and llama.cpp's f32 file of it (which holds the
    scaling as a rope_freqs tensor of one divisor per rotated pair)."""
    from gguf_files import peer_convert

    from models import ORACLE_CONFIGS, make_checkpoint

    root = tmp_path_factory.mktemp("scout-rope")
    config_cls, model_cls, kwargs = ORACLE_CONFIGS[KIND]
    as_llama_cpp = dict(attention_chunk_size=8192, floor_scale=8192, no_rope_layers=None, rope_parameters=SCOUT_ROPE)
    model_dir = make_checkpoint((config_cls, model_cls, dict(kwargs, vocab_size=512, **as_llama_cpp)), root / "m")
    return model_dir, peer_convert(model_dir, root / "llama4.gguf", "f32")


@pytest.mark.slow  # llama.cpp's converter runs once (shared with the next test)
def test_a_file_with_llamas_rope_freqs_imports_with_the_configs_llama3_scaling(scout_rope_gguf):
    import gguf as gg

    model_dir, path = scout_rope_gguf
    assert "rope_freqs.weight" in {t.name for t in gg.GGUFReader(str(path)).tensors}
    from_hf, from_gguf = load_model(model_dir), load_model(path)
    assert from_hf.spec.rope == RopeSpec(500000.0, "llama3", 16.0, 1.0, 1.0, 1024)
    assert dataclasses.replace(from_gguf.spec, name=from_hf.spec.name) == from_hf.spec
    assert list(from_gguf.tensors) == list(from_hf.tensors)  # the divisors are no weight


@pytest.mark.slow  # (the converted file of the test before)
def test_rope_freqs_no_llama3_scaling_gives_are_refused_in_one_line(scout_rope_gguf, tmp_path, capsys):
    import gguf as gg

    from generator.cli import main

    src = gg.GGUFReader(str(scout_rope_gguf[1]))
    freqs = next(t for t in src.tensors if t.name == "rope_freqs.weight")
    start = int(freqs.data_offset)
    for case, value in (("a fast pair slowed", 2.0), ("a divisor under 1", 0.5)):
        data = bytearray(src.data)
        data[start : start + 4] = struct.pack("<f", value)  # the first (fastest) pair's divisor
        path = tmp_path / f"{case}.gguf"
        path.write_bytes(bytes(data))
        capsys.readouterr()
        assert main(["build", "--model", str(path), "--out", str(tmp_path / "out")]) == 2, case
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and "tensor 'rope_freqs.weight' must hold 8 llama3 RoPE scaling divisors" in err[0], err
