"""The DeepSeek line's MoE block (numerics/routing.py, runtime/router.c), proven through GLM-4.x MoE
(ordinary attention, the same routing): sigmoid scores chosen with the correction bias, group
limits, renormalised and scaled weights, ungated shared experts, dense first layers; the
multi-token-prediction layers a checkpoint holds left out. The f32 oracle and the q8_0 host runs
are test_oracle.py's (ORACLE_CONFIGS["glm4_moe"])."""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest
from cli_runs import assert_decodes_as_the_reference, run_prompt

from generator.boards import load_board
from generator.compile.cache_plan import cache_plan
from generator.compile.plan import make_plan
from generator.device.session import cache_stats
from generator.model.hf.load import load_hf
from generator.model.spec import ModelSpec, RopeSpec
from generator.numerics.routing import route
from generator.numerics.sampling import SamplingParams
from generator.report import format_report, planned_report

PROMPT = [1, 17, 42, 99, 7]
SAMPLED = SamplingParams(0.9, top_k=40, top_p=0.95, min_p=0.01, seed=7)


def router_spec(**fields) -> ModelSpec:
    base = ModelSpec(
        name="r", architecture="Glm4MoeForCausalLM", family="glm4_moe", vocab_size=8, hidden_size=4,
        intermediate_size=4, n_layers=1, n_heads=1, n_kv_heads=1, head_dim=4, rms_norm_eps=1e-6,
        rope=RopeSpec(theta=10000.0), max_position_embeddings=8, tie_embeddings=False, qkv_bias=False,
        o_bias=False, mlp_bias=False, qk_norm=False, n_experts=8, experts_per_token=2,
    )  # fmt: skip
    return replace(base, **fields)


def logits_of(scores: list[float]) -> np.ndarray:
    """Router logits whose sigmoids are `scores`."""
    p = np.asarray(scores, np.float64)
    return np.log(p / (1 - p)).astype(np.float32)


def test_the_correction_bias_chooses_and_the_scores_weigh():
    spec = router_spec(router="sigmoid", router_choice_bias=True)
    logits = logits_of([0.9, 0.8, 0.7, 0.1, 0.1, 0.1, 0.1, 0.1])
    bias = np.array([0, 0, 0.3, 0, 0, 0, 0, 0], np.float32)
    chosen, weights = route(spec, logits, bias)
    assert chosen.tolist() == [2, 0]  # 0.7 + 0.3 first, then 0.9
    assert np.allclose(weights, [0.7, 0.9], atol=1e-6)  # the unbiased scores


def test_group_limits_keep_the_experts_of_the_best_groups_only():
    # Groups of two: {0,1} scores 0.9 + 0.1, {2,3} 0.6 + 0.5, {4,5} 0.55 + 0.55, {6,7} 0.2 + 0.2.
    logits = logits_of([0.9, 0.1, 0.6, 0.5, 0.55, 0.55, 0.2, 0.2])
    free = router_spec(router="sigmoid", experts_per_token=3)
    assert route(free, logits, None)[0].tolist() == [0, 2, 4]
    grouped = replace(free, expert_groups=4, expert_groups_used=2)  # {2,3} and {4,5} win on their top two
    assert route(grouped, logits, None)[0].tolist() == [2, 4, 5]
    # V2's group_limited_greedy: softmax probabilities, a group scores its best one ({0,1} and {2,3} win).
    v2 = replace(grouped, router="softmax_then_topk")
    assert route(v2, logits, None)[0].tolist() == [0, 2, 3]


def test_weights_are_renormalised_then_scaled():
    spec = router_spec(router="sigmoid", norm_topk_prob=True, routed_scaling=2.5)
    chosen, weights = route(spec, logits_of([0.6, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.4]), None)
    assert chosen.tolist() == [0, 7]
    assert np.allclose(weights, [1.5, 1.0], atol=1e-6)


def test_glm4_moe_config_resolves_to_the_routing_fields(checkpoints):
    spec = load_hf(checkpoints("glm4_moe"), load_tensors=False).spec
    assert spec.family == "glm4_moe" and spec.moe_layers == (False, True, True)
    assert (spec.router, spec.router_choice_bias, spec.expert_groups, spec.expert_groups_used) == (
        "sigmoid",
        True,
        4,
        2,
    )
    assert spec.routed_scaling == 2.5 and spec.norm_topk_prob
    assert spec.shared_expert_intermediate_size == 64 and spec.ungated_shared_expert  # 2 x 32, no gate
    assert spec.qk_norm and spec.qkv_bias and not spec.o_bias and spec.rotary_dim == 16


def test_multi_token_prediction_layers_are_left_out_and_reported(checkpoints, tmp_path):
    from safetensors.numpy import load_file, save_file

    model = tmp_path / "glm"
    shutil.copytree(checkpoints("glm4_moe"), model)
    tensors = load_file(model / "model.safetensors")
    mtp = {  # the layer past the last (num_nextn_predict_layers 1): its own projections and a decoder layer
        "model.layers.3.eh_proj.weight": np.zeros((64, 128), np.float32),
        "model.layers.3.enorm.weight": np.ones(64, np.float32),
        "model.layers.3.self_attn.q_proj.weight": np.zeros((128, 64), np.float32),
    }
    save_file({**tensors, **mtp}, model / "model.safetensors", metadata={"format": "pt"})
    checkpoint = load_hf(model)
    assert checkpoint.spec.mtp_layers == 1 and not any(n.startswith("layers.3.") for n in checkpoint.tensors)
    assert checkpoint.spec.to_json() == replace(checkpoint.spec, mtp_layers=0).to_json()  # nothing built changes
    plan = make_plan(checkpoint.spec, "host", "q8_0", 64)
    assert "multi-token-prediction layers left out: 1" in format_report(planned_report(load_board("host"), plan))
    save_file({**tensors, "model.layers.4.enorm.weight": np.ones(64, np.float32)}, model / "model.safetensors")
    with pytest.raises(Exception, match="unexpected tensor 'model.layers.4.enorm.weight'"):
        load_hf(model)


@pytest.mark.slow  # runs under qemu-aarch64 and qemu-system-riscv32
@pytest.mark.parametrize("quant, board", [("q4_0", "linux-aarch64"), ("q8_0", "qemu-rv32")])
def test_glm4_moe_decodes_the_reference_bits_on_emulated_boards(quant, board, checkpoints, builder):
    b, art, plan = builder.build(checkpoints("glm4_moe"), quant, 32, board)
    request, result = run_prompt(b, art, PROMPT, 8, SAMPLED, threads=2 if board == "linux-aarch64" else 1)
    assert result.hello["board"] == board
    assert_decodes_as_the_reference(plan, art, request, result)


@pytest.mark.slow  # one firmware build and runs under a memory budget (about 10 s)
def test_the_expert_cache_keeps_shared_experts_and_dense_layers_resident(checkpoints, builder):
    board, art, plan = builder.build(checkpoints("glm4_moe"), "q8_0", 64)
    c = cache_plan(plan, board.budget_reserve, 0).constants
    resident = {t.name for t in plan.tensors if ".experts." not in t.name}
    assert {"layers.0.w_gate", "layers.1.shared.w_gate", "layers.2.router_choice_bias"} <= resident
    request, unlimited = run_prompt(board, art, PROMPT, 12, SAMPLED)
    assert_decodes_as_the_reference(plan, art, request, unlimited)
    _, budgeted = run_prompt(board, art, PROMPT, 12, SAMPLED, budget=c.min_budget)
    stats = cache_stats(budgeted)
    assert stats.slots == c.experts_per_token < c.max_slots and stats.cache_misses > 0
    assert budgeted.tokens == unlimited.tokens and budgeted.digests == unlimited.digests
    assert budgeted.expert_counts == unlimited.expert_counts


def test_dense_layers_lead_and_moe_layer_freq_spaces_the_rest(checkpoints):
    import json

    from generator.model.hf.config import parse_config

    config = json.loads((checkpoints("glm4_moe") / "config.json").read_text())
    spec = parse_config(dict(config, num_hidden_layers=6, moe_layer_freq=2), "glm")
    assert spec.moe_layers == (False, False, True, False, True, False)  # from layer 1, every 2nd (DeepSeek's rule)


def test_v2_topk_method_decides_the_group_limits():
    from generator.model.family_blocks import Moe
    from generator.model.hf.config import _Config, _deepseek_moe

    v2 = Moe("first_k_dense", shared_expert="ungated", groups="topk_method")
    config = dict(n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=2, n_group=4,
                  topk_group=2, first_k_dense_replace=1)  # fmt: skip
    greedy = _deepseek_moe(_Config(dict(config, topk_method="greedy"), "config.json"), v2, 3)
    limited = _deepseek_moe(_Config(dict(config, topk_method="group_limited_greedy"), "config.json"), v2, 3)
    assert (greedy["expert_groups"], limited["expert_groups"], limited["expert_groups_used"]) == (0, 4, 2)
    assert limited["router"] == "softmax_then_topk" and not limited["router_choice_bias"]
    with pytest.raises(Exception, match="unsupported topk_method"):
        _deepseek_moe(_Config(dict(config, topk_method="noaux"), "config.json"), v2, 3)
