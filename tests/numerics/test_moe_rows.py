"""OLMoE and Phi-3.5-MoE, the families added as rows of the family table (tests/models.py "olmoe":
q/k RMSNorm over all the heads' queries and all the keys, 8 experts top-3 whose softmax weights are
not renormalised; "phimoe": LayerNorm with weights and biases, q/k/v/o biases, the output matrix's
bias, a sliding window shorter than the decode, 8 experts routed by the sparsemixer): their specs,
the sparsemixer's weights against transformers' own function, the emulated boards decoding the
reference's bits, the smallest memory budget (fewer slots than experts) decoding the unlimited run's
bits, and each checkpoint as llama.cpp's own convert_hf_to_gguf.py writes it importing to the same
spec and tensors and verifying. tests/numerics/test_oracle.py checks the f32 firmware against
transformers and q8_0 against the reference."""

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

KINDS = ("olmoe", "phimoe")
PROMPT = [1, 17, 42, 99, 7, 3, 250, 64]  # with the decode, longer than Phi-3.5-MoE's window (8)
STEPS = 10
SAMPLED = SamplingParams(0.9, top_k=40, top_p=0.95, min_p=0.01, seed=7)


def test_olmoe_norms_span_every_head_and_its_router_keeps_the_softmax_weights(checkpoints):
    spec = load_hf(checkpoints("olmoe"), load_tensors=False).spec
    assert spec.family == "olmoe" and spec.qk_norm and spec.qk_norm_whole
    assert spec.moe_layers == (True, True) and not spec.norm_topk_prob and spec.router == "softmax_then_topk"
    assert (spec.n_experts, spec.experts_per_token, spec.expert_intermediate_size) == (8, 3, 32)
    shapes = {t.name: (t.rows, t.cols) for t in make_plan(spec, "host", "f32", 32).tensors}
    assert shapes["layers.1.q_norm"] == (1, 64) and shapes["layers.1.k_norm"] == (1, 32)


def test_phimoe_norms_have_biases_and_its_router_is_the_sparsemixer(checkpoints):
    spec = load_hf(checkpoints("phimoe"), load_tensors=False).spec
    assert spec.family == "phimoe" and spec.layer_norm and spec.lm_head_bias and spec.qkv_bias and spec.o_bias
    assert spec.router == "sparsemixer" and spec.router_jitter == 0.25 and spec.experts_per_token == 2
    assert spec.layer_windows == (8, 8) and not spec.norm_topk_prob
    names = {t.name for t in make_plan(spec, "host", "f32", 32).tensors}
    assert {"layers.1.attn_norm_bias", "layers.1.ffn_norm_bias", "final_norm_bias", "lm_head_bias"} <= names


def test_the_sparsemixer_weights_are_transformers_in_eval_mode():
    """Random logits, some within the threshold of the chosen ones, some not, some zero."""
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
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("quant, board", [("q4_0", "linux-aarch64"), ("q8_0", "qemu-rv32")])
def test_emulated_boards_decode_the_reference_bits(kind, quant, board, checkpoints, builder):
    b, art, plan = builder.build(checkpoints(kind), quant, 32, board)
    request, result = run_prompt(b, art, PROMPT, STEPS, SAMPLED, threads=2 if board == "linux-aarch64" else 1)
    assert result.hello["board"] == board and len(result.tokens) == STEPS
    assert_decodes_as_the_reference(plan, art, request, result)


@pytest.mark.slow  # one host build, run unlimited and under the smallest budget
@pytest.mark.parametrize("kind", KINDS)
def test_the_smallest_budget_has_fewer_slots_than_experts_and_the_same_bits(kind, checkpoints, builder):
    board, art, plan = builder.build(checkpoints(kind), "q8_0", 32)
    c = cache_plan(plan, board.budget_reserve, 0).constants
    request, unlimited = run_prompt(board, art, PROMPT, STEPS, SAMPLED)
    assert_decodes_as_the_reference(plan, art, request, unlimited)
    _, budgeted = run_prompt(board, art, PROMPT, STEPS, SAMPLED, threads=2, budget=c.min_budget)
    stats = cache_stats(budgeted)
    assert stats.slots == plan.spec.experts_per_token < plan.spec.n_experts and stats.cache_misses > 0
    assert budgeted.tokens == unlimited.tokens and budgeted.digests == unlimited.digests


# What the converter is given where transformers' config.json is not what it reads: Phi-3.5-MoE's
# class as Microsoft's checkpoint names it (PhiMoEForCausalLM, the name it registers) and the
# original context length, which it reads whatever the RoPE.
AS_PUBLISHED = {"phimoe": dict(architectures=["PhiMoEForCausalLM"])}


@pytest.fixture(scope="module", params=KINDS)
def peer(request, tmp_path_factory):
    """(kind, the random-init checkpoint (vocab 512: kjv-tiny's tokenizer, which the converter
    needs), {outtype: .gguf} as llama.cpp's own convert_hf_to_gguf.py writes it, f32 and q8_0)."""
    from gguf_files import peer_convert

    from models import ORACLE_CONFIGS, make_checkpoint

    kind = request.param
    config_cls, model_cls, kwargs = ORACLE_CONFIGS[kind]
    root = tmp_path_factory.mktemp(f"{kind}-peer")
    model_dir = make_checkpoint((config_cls, model_cls, dict(kwargs, vocab_size=512)), root / "model")
    given = model_dir
    if kind in AS_PUBLISHED:
        given = root / "as-published"
        shutil.copytree(model_dir, given)
        config = dict(json.loads((model_dir / "config.json").read_text()), **AS_PUBLISHED[kind])
        config["rope_parameters"]["original_max_position_embeddings"] = config["max_position_embeddings"]
        (given / "config.json").write_text(json.dumps(config))
    return kind, model_dir, {t: peer_convert(given, root / f"{kind}-{t}.gguf", t) for t in ("f32", "q8_0")}


def bits(tensor):
    return np.asarray(tensor.load(), dtype=np.float32).view(np.uint32)


@pytest.mark.slow  # llama.cpp's converter runs twice per family
def test_the_file_llama_cpp_converts_imports_as_its_safetensors_do(peer):
    kind, model_dir, files = peer
    from_hf, from_gguf = load_model(model_dir), load_model(files["f32"])
    spec = from_hf.spec
    # (A phimoe file has no key for the sparsemixer's jitter: transformers' default, 0.01, is taken.)
    assert from_gguf.spec.router_jitter == (0.01 if kind == "phimoe" else 0.0)
    assert dataclasses.replace(from_gguf.spec, name=spec.name, router_jitter=spec.router_jitter) == spec
    assert list(from_gguf.tensors) == list(from_hf.tensors)
    differ = [n for n in from_hf.tensors if not np.array_equal(bits(from_hf.tensors[n]), bits(from_gguf.tensors[n]))]
    assert differ == []


@pytest.mark.slow  # the verify command builds and runs the firmware
def test_verify_passes_on_the_converted_file_with_its_q8_0_blocks_kept(peer, tmp_path):
    verify_passes(
        tmp_path / "out", board="host", model=peer[2]["q8_0"], quant="gguf", prompt_ids="1,5,9,200,7", steps=10,
        ctx=32, ignore_eos=True,
    )  # fmt: skip


@pytest.mark.slow  # (the converted file of the tests above)
@pytest.mark.parametrize("peer", ["phimoe"], indirect=True)
def test_a_phimoe_file_whose_sparsemixer_takes_three_experts_is_refused(peer, tmp_path):
    from gguf_files import with_u32_key

    from generator.errors import ColibriError

    path = with_u32_key(peer[2]["f32"], "phimoe.expert_used_count", 3, tmp_path / "three.gguf")
    with pytest.raises(ColibriError, match="expert_used_count 3: the sparsemixer router picks exactly 2 experts"):
        load_model(path, load_tensors=False)
