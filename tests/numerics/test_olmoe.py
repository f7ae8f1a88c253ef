"""OLMoE (tests/models.py "olmoe": q/k RMSNorm over all the heads' queries and all the keys, 8
experts top-3 whose softmax weights are not renormalised, every layer routed): the spec says it, the
emulated boards decode the reference's bits, the smallest memory budget (fewer slots than experts)
decodes the unlimited run's bits, and the checkpoint as llama.cpp's own convert_hf_to_gguf.py writes
it imports to the same spec and tensors and verifies. tests/numerics/test_oracle.py checks the f32
firmware against transformers and q8_0 against the reference."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from cli_runs import assert_decodes_as_the_reference, run_prompt, verify_passes

from generator.compile.cache_plan import cache_plan
from generator.compile.plan import make_plan
from generator.device.session import cache_stats
from generator.model.hf.load import load_hf
from generator.model.load import load_model
from generator.numerics.sampling import SamplingParams

PROMPT = [1, 17, 42, 99, 7, 3, 250, 64]
STEPS = 10
SAMPLED = SamplingParams(0.9, top_k=40, top_p=0.95, min_p=0.01, seed=7)


def test_the_qk_norms_span_every_head_and_the_router_keeps_its_softmax_weights(checkpoints):
    spec = load_hf(checkpoints("olmoe"), load_tensors=False).spec
    assert spec.family == "olmoe" and spec.qk_norm and spec.qk_norm_whole
    assert spec.moe_layers == (True, True) and not spec.norm_topk_prob and spec.router == "softmax_then_topk"
    assert (spec.n_experts, spec.experts_per_token, spec.expert_intermediate_size) == (8, 3, 32)
    shapes = {t.name: (t.rows, t.cols) for t in make_plan(spec, "host", "f32", 32).tensors}
    assert shapes["layers.1.q_norm"] == (1, 64) and shapes["layers.1.k_norm"] == (1, 32)


@pytest.mark.slow  # runs under qemu-aarch64 (2 threads) and qemu-system-riscv32
@pytest.mark.parametrize("quant, board", [("q4_0", "linux-aarch64"), ("q8_0", "qemu-rv32")])
def test_emulated_boards_decode_the_reference_bits(quant, board, checkpoints, builder):
    b, art, plan = builder.build(checkpoints("olmoe"), quant, 32, board)
    request, result = run_prompt(b, art, PROMPT, STEPS, SAMPLED, threads=2 if board == "linux-aarch64" else 1)
    assert result.hello["board"] == board and len(result.tokens) == STEPS
    assert_decodes_as_the_reference(plan, art, request, result)


@pytest.mark.slow  # one host build, run unlimited and under the smallest budget
def test_the_smallest_budget_has_fewer_slots_than_experts_and_the_same_bits(checkpoints, builder):
    board, art, plan = builder.build(checkpoints("olmoe"), "q8_0", 32)
    c = cache_plan(plan, board.budget_reserve, 0).constants
    request, unlimited = run_prompt(board, art, PROMPT, STEPS, SAMPLED)
    assert_decodes_as_the_reference(plan, art, request, unlimited)
    _, budgeted = run_prompt(board, art, PROMPT, STEPS, SAMPLED, threads=2, budget=c.min_budget)
    stats = cache_stats(budgeted)
    assert stats.slots == 3 < 8 and stats.cache_misses > 0
    assert budgeted.tokens == unlimited.tokens and budgeted.digests == unlimited.digests


@pytest.fixture(scope="module")
def olmoe_peer(tmp_path_factory):
    """The random-init checkpoint (vocab 512: kjv-tiny's tokenizer, which the converter needs) and
    {outtype: .gguf} as llama.cpp's own convert_hf_to_gguf.py writes it, f32 and q8_0."""
    from gguf_files import peer_convert

    from models import ORACLE_CONFIGS, make_checkpoint

    config_cls, model_cls, kwargs = ORACLE_CONFIGS["olmoe"]
    root = tmp_path_factory.mktemp("olmoe-peer")
    model_dir = make_checkpoint((config_cls, model_cls, dict(kwargs, vocab_size=512)), root / "model")
    return model_dir, {t: peer_convert(model_dir, root / f"olmoe-{t}.gguf", t) for t in ("f32", "q8_0")}


def bits(tensor):
    return np.asarray(tensor.load(), dtype=np.float32).view(np.uint32)


@pytest.mark.slow  # llama.cpp's converter runs twice
def test_olmoe_converted_by_llama_cpp_imports_as_its_safetensors_do(olmoe_peer):
    model_dir, files = olmoe_peer
    from_hf, from_gguf = load_model(model_dir), load_model(files["f32"])
    spec = from_hf.spec
    assert dataclasses.replace(from_gguf.spec, name=spec.name) == spec
    assert list(from_gguf.tensors) == list(from_hf.tensors)
    differ = [n for n in from_hf.tensors if not np.array_equal(bits(from_hf.tensors[n]), bits(from_gguf.tensors[n]))]
    assert differ == []
    q8 = load_model(files["q8_0"], load_tensors=False)
    assert dataclasses.replace(q8.spec, name=spec.name) == spec


@pytest.mark.slow  # the verify command builds and runs the firmware
def test_verify_passes_on_olmoe_converted_by_llama_cpp_with_its_q8_0_blocks_kept(olmoe_peer, tmp_path):
    _, files = olmoe_peer
    verify_passes(
        tmp_path / "out", board="host", model=files["q8_0"], quant="gguf", prompt_ids="1,5,9,200,7", steps=10,
        ctx=32, ignore_eos=True,
    )  # fmt: skip
