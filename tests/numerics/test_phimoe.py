"""Phi-3.5-MoE (tests/models.py "phimoe": LayerNorm with weights and biases, q/k/v/o biases, the
output matrix's bias, a sliding window shorter than the decode, 8 experts routed by the sparsemixer):
the spec says it, the sparsemixer's weights are transformers', the emulated boards decode the
reference's bits, the smallest memory budget (fewer slots than experts) decodes the unlimited run's
bits, and the checkpoint as llama.cpp's own convert_hf_to_gguf.py writes it imports to the same spec
and tensors and verifies. tests/numerics/test_oracle.py checks the f32 firmware against transformers
and q8_0 against the reference."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
from cli_runs import assert_decodes_as_the_reference, run_prompt, verify_passes

from generator.compile.cache_plan import cache_plan
from generator.compile.plan import make_plan
from generator.device.session import cache_stats
from generator.model.hf.load import load_hf
from generator.model.load import load_model
from generator.numerics.ops import sparsemixer_weights
from generator.numerics.sampling import SamplingParams

PROMPT = [1, 17, 42, 99, 7, 3, 250, 64]  # longer than the sliding window (8) with the decode
STEPS = 10
SAMPLED = SamplingParams(0.9, top_k=40, top_p=0.95, min_p=0.01, seed=7)


def test_the_norms_have_biases_and_the_router_is_the_sparsemixer(checkpoints):
    spec = load_hf(checkpoints("phimoe"), load_tensors=False).spec
    assert spec.family == "phimoe" and spec.layer_norm and spec.lm_head_bias and spec.qkv_bias and spec.o_bias
    assert spec.router == "sparsemixer" and spec.router_jitter == 0.25 and spec.experts_per_token == 2
    assert spec.layer_windows == (8, 8) and not spec.norm_topk_prob
    names = {t.name for t in make_plan(spec, "host", "f32", 32).tensors}
    assert {"layers.1.attn_norm_bias", "layers.1.ffn_norm_bias", "final_norm_bias", "lm_head_bias"} <= names


def test_the_sparsemixer_weights_are_transformers_in_eval_mode():
    """Random logits, some within the threshold of the chosen ones, some not, one tie at zero."""
    import torch
    from transformers.models.phimoe.modeling_phimoe import sparsemixer

    rng = np.random.default_rng(3)
    logits = rng.normal(0, 1, (200, 8)).astype(np.float32)
    logits[:50, 5] = logits[:50, 2] * np.float32(0.9)  # near the chosen one
    logits[50:60, 0] = 0.0
    for jitter in (0.01, 0.25):
        theirs, ids = sparsemixer(torch.from_numpy(logits), jitter_eps=jitter, training=False)
        for row, (w, chosen) in enumerate(zip(theirs.numpy(), ids.numpy())):
            ours = sparsemixer_weights(logits[row], chosen, 2 * jitter)
            np.testing.assert_allclose(ours, w, rtol=2e-6, atol=0)


@pytest.mark.slow  # runs under qemu-aarch64 (2 threads) and qemu-system-riscv32
@pytest.mark.parametrize("quant, board", [("q4_0", "linux-aarch64"), ("q8_0", "qemu-rv32")])
def test_emulated_boards_decode_the_reference_bits(quant, board, checkpoints, builder):
    b, art, plan = builder.build(checkpoints("phimoe"), quant, 32, board)
    request, result = run_prompt(b, art, PROMPT, STEPS, SAMPLED, threads=2 if board == "linux-aarch64" else 1)
    assert result.hello["board"] == board and len(result.tokens) == STEPS
    assert_decodes_as_the_reference(plan, art, request, result)


@pytest.mark.slow  # one host build, run unlimited and under the smallest budget
def test_the_smallest_budget_has_fewer_slots_than_experts_and_the_same_bits(checkpoints, builder):
    board, art, plan = builder.build(checkpoints("phimoe"), "q8_0", 32)
    c = cache_plan(plan, board.budget_reserve, 0).constants
    request, unlimited = run_prompt(board, art, PROMPT, STEPS, SAMPLED)
    assert_decodes_as_the_reference(plan, art, request, unlimited)
    _, budgeted = run_prompt(board, art, PROMPT, STEPS, SAMPLED, threads=2, budget=c.min_budget)
    stats = cache_stats(budgeted)
    assert stats.slots == 2 < 8 and stats.cache_misses > 0
    assert budgeted.tokens == unlimited.tokens and budgeted.digests == unlimited.digests


@pytest.fixture(scope="module")
def phimoe_peer(tmp_path_factory):
    """The random-init checkpoint (vocab 512: kjv-tiny's tokenizer, which the converter needs) and
    {outtype: .gguf} as llama.cpp's own convert_hf_to_gguf.py writes it, f32 and q8_0. The converter
    is given a copy whose config.json names the class as Microsoft's checkpoint does
    (PhiMoEForCausalLM, the name it registers) and says the original context length, which it reads
    whatever the RoPE."""
    from gguf_files import peer_convert

    from models import ORACLE_CONFIGS, make_checkpoint

    config_cls, model_cls, kwargs = ORACLE_CONFIGS["phimoe"]
    root = tmp_path_factory.mktemp("phimoe-peer")
    model_dir = make_checkpoint((config_cls, model_cls, dict(kwargs, vocab_size=512)), root / "model")
    as_published = root / "as-published"
    shutil.copytree(model_dir, as_published)
    config = json.loads((model_dir / "config.json").read_text())
    config["architectures"] = ["PhiMoEForCausalLM"]
    config["rope_parameters"]["original_max_position_embeddings"] = config["max_position_embeddings"]
    (as_published / "config.json").write_text(json.dumps(config))
    return model_dir, {t: peer_convert(as_published, root / f"phimoe-{t}.gguf", t) for t in ("f32", "q8_0")}


def bits(tensor):
    return np.asarray(tensor.load(), dtype=np.float32).view(np.uint32)


@pytest.mark.slow  # llama.cpp's converter runs twice
def test_phimoe_converted_by_llama_cpp_imports_as_its_safetensors_do(phimoe_peer):
    model_dir, files = phimoe_peer
    from_hf, from_gguf = load_model(model_dir), load_model(files["f32"])
    spec = from_hf.spec
    # (The file has no key for the sparsemixer's jitter: llama.cpp's default, transformers' 0.01.)
    assert from_gguf.spec.router_jitter == 0.01
    assert dataclasses.replace(from_gguf.spec, name=spec.name, router_jitter=0.25) == spec
    assert list(from_gguf.tensors) == list(from_hf.tensors)
    differ = [n for n in from_hf.tensors if not np.array_equal(bits(from_hf.tensors[n]), bits(from_gguf.tensors[n]))]
    assert differ == []


@pytest.mark.slow  # the verify command builds and runs the firmware
def test_verify_passes_on_phimoe_converted_by_llama_cpp_with_its_q8_0_blocks_kept(phimoe_peer, tmp_path):
    _, files = phimoe_peer
    verify_passes(
        tmp_path / "out", board="host", model=files["q8_0"], quant="gguf", prompt_ids="1,5,9,200,7", steps=10,
        ctx=32, ignore_eos=True,
    )  # fmt: skip


@pytest.mark.slow  # (the converted file of the tests above)
def test_a_phimoe_file_whose_sparsemixer_takes_three_experts_is_refused(phimoe_peer, tmp_path):
    from gguf_files import with_u32_key

    from generator.errors import ColibriError

    path = with_u32_key(phimoe_peer[1]["f32"], "phimoe.expert_used_count", 3, tmp_path / "three.gguf")
    with pytest.raises(ColibriError, match="expert_used_count 3: the sparsemixer router picks exactly 2 experts"):
        load_model(path, load_tensors=False)
