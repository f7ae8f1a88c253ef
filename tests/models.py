"""Tiny random-init checkpoints made with transformers at fixed seeds (the tests' oracle models).

Every config is small enough to build and run in seconds, yet covers what the issue asks:
GQA ratios > 1, head_dim 48, a vocabulary that is not a multiple of 32, untied lm_head, RoPE
scaling (linear and llama3), a Mistral sliding window shorter than the decode, Qwen2 q/k/v
biases, Qwen3 q/k norms with head_dim independent of hidden/heads.
"""

from __future__ import annotations

from pathlib import Path

# The hybrids' tiny shape: four layers of two kinds alternating, 4 query heads over 2 KV heads.
TINY_HYBRID = dict(vocab_size=256, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)

# LFM2's layers, shared by "lfm2" and "lfm2_moe": gated short convolutions (3 taps) and
# full-attention layers with q/k norms, alternating.
LFM2_LAYERS = dict(
    TINY_HYBRID,
    conv_L_cache=3,
    layer_types=["conv", "full_attention", "conv", "full_attention"],
    max_position_embeddings=128,
)


# Granite 4.0 hybrid's layers, shared by "granite_hybrid" and "granite_hybrid_moe": Mamba-2 and
# attention alternating, every multiplier away from 1.
GRANITE_HYBRID_LAYERS = dict(
    TINY_HYBRID,
    intermediate_size=32,
    shared_intermediate_size=64,
    layer_types=["mamba", "attention", "mamba", "attention"],
    mamba_n_heads=8,
    mamba_n_groups=2,
    mamba_d_state=16,
    mamba_d_conv=4,
    mamba_expand=2,
    mamba_chunk_size=8,
    embedding_multiplier=1.5,
    residual_multiplier=0.7,
    attention_multiplier=0.2,
    logits_scaling=2.5,
    max_position_embeddings=128,
    tie_word_embeddings=False,
)

# Qwen3's tiny shape (q/k norms per head), shared by "qwen3_qknorm" and "qwen3_qknorm_kv4".
QWEN3_TINY = dict(
    vocab_size=160,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    max_position_embeddings=128,
    tie_word_embeddings=False,
)

ORACLE_CONFIGS = {
    # GQA 2:1, head_dim 48, vocab 250, untied, linear RoPE scaling.
    "llama_gqa_linear": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            vocab_size=250,
            hidden_size=96,
            intermediate_size=160,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=128,
            tie_word_embeddings=False,
            rope_scaling={"rope_type": "linear", "factor": 2.0},
            rms_norm_eps=1e-5,
        ),
    ),
    # GQA 4:1, tied, llama3 RoPE scaling, attention biases.
    "llama3_rope_bias": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            vocab_size=203,
            hidden_size=128,
            intermediate_size=192,
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads=2,
            max_position_embeddings=256,
            tie_word_embeddings=True,
            attention_bias=True,
            mlp_bias=True,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
    ),
    # Sliding window 8, shorter than the 28-step decode.
    "mistral_window": (
        "MistralConfig",
        "MistralForCausalLM",
        dict(
            vocab_size=200,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            sliding_window=8,
            tie_word_embeddings=False,
        ),
    ),
    # q/k/v biases, tied.
    "qwen2_bias": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(
            vocab_size=151,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            tie_word_embeddings=True,
        ),
    ),
    # q/k RMSNorm, head_dim 32 with hidden 64 and 4 heads (q_dim 128 != hidden), untied.
    "qwen3_qknorm": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(QWEN3_TINY, num_attention_heads=4, num_key_value_heads=2, head_dim=32),
    ),
    # qwen3_qknorm's per-head q/k norms with 8 query heads over 4 KV groups of head_dim 64: the
    # KV groups go round 2 and 4 MPI ranks (attention split by KV group, tests/device/test_mpi_ranks.py).
    "qwen3_qknorm_kv4": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(QWEN3_TINY, num_attention_heads=8, num_key_value_heads=4, head_dim=64),
    ),
    # Gemma 3: 5 sliding layers (window 4) + 1 global, each kind with its own RoPE (global scaled),
    # head_dim 32 independent of hidden/heads, query_pre_attn_scalar, both softcaps, vocab 262.
    "gemma3_text": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            vocab_size=262,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=6,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            query_pre_attn_scalar=24,
            max_position_embeddings=128,
            sliding_window=4,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        ),
    ),
    # Mixtral: 4 experts, top-2 (softmax over the top-k logits), GQA, a sliding window.
    "mixtral_moe": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(
            vocab_size=150,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=16,
            tie_word_embeddings=False,
        ),
    ),
    # Qwen2-MoE: shared expert with a sigmoid gate, no top-k renormalisation, q/k/v biases,
    # decoder_sparse_step 2 plus mlp_only_layers: layers 0 and 2 dense, 1 and 3... 3 listed dense.
    "qwen2_moe_shared": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(
            vocab_size=170,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            num_experts=6,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            norm_topk_prob=False,
            decoder_sparse_step=2,
            mlp_only_layers=[3],
            tie_word_embeddings=False,
        ),
    ),
    # Qwen3-MoE: q/k norms, top-k renormalised, every layer routed.
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(
            vocab_size=140,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            max_position_embeddings=128,
            num_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            tie_word_embeddings=True,
        ),
    ),
    # Qwen3-MoE whose experts are 48 wide: their down projections' rows are not whole q8_0 blocks,
    # so a q8_0 or q4_0 plan keeps those matrices in f32 and quantizes the rest.
    "qwen3_moe_odd_experts": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(
            vocab_size=140,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            max_position_embeddings=128,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=48,
            norm_topk_prob=True,
            tie_word_embeddings=False,
        ),
    ),
    # Qwen3.5-MoE text tower: 3 Gated DeltaNet layers + 1 gated full-attention layer (layer_types),
    # 2 key heads shared by 4 value heads, conv kernel 4, partial RoPE (a quarter of head_dim 16),
    # 8 experts top-2 renormalised, a shared expert with its sigmoid gate, (1 + w) norms.
    "qwen3_5_moe": (
        "Qwen3_5MoeTextConfig",
        "Qwen3_5MoeForCausalLM",
        dict(
            vocab_size=256,
            hidden_size=64,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            linear_conv_kernel_dim=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            max_position_embeddings=128,
            tie_word_embeddings=False,
        ),
    ),
    # gpt-oss: sinks, sliding (window 4, shorter than the decode) and full layers alternating, YaRN
    # RoPE, biases on q/k/v/o, the router and every expert; 8 experts, top-4 then softmax; the
    # clamped SwiGLU; experts 96 wide (not the hidden 64), so a transposed layout would not fit.
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=256,
            num_local_experts=8,
            num_experts_per_tok=4,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 64,
            },
            tie_word_embeddings=False,
        ),
    ),
    # Gemma 4 text: sliding layers (window 4, head_dim 16, 2 KV heads) and global layers (head_dim 32,
    # 1 KV head, keys equal to values, proportional RoPE over a quarter of the pairs), per-layer
    # inputs 32 wide, norms scaling by w, learned layer scalars, the final softcap.
    "gemma4_text": (
        "Gemma4TextConfig",
        "Gemma4ForCausalLM",
        dict(
            vocab_size=262,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=6,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            global_head_dim=32,
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            sliding_window=4,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
            hidden_size_per_layer_input=32,
            vocab_size_per_layer_input=262,
            final_logit_softcapping=30.0,
            max_position_embeddings=128,
        ),
    ),
    # Gemma 4's MoE block (the 26B-A4B's shape, small): the dense FFN beside 8 experts top-2 with
    # their router norm and per-expert scales; k_eq_v global layers; no per-layer inputs; untied.
    "gemma4_moe": (
        "Gemma4TextConfig",
        "Gemma4ForCausalLM",
        dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            global_head_dim=32,
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"] * 2,
            hidden_size_per_layer_input=0,
            enable_moe_block=True,
            num_experts=8,
            top_k_experts=2,
            moe_intermediate_size=32,
            final_logit_softcapping=30.0,
            max_position_embeddings=128,
            tie_word_embeddings=False,
        ),
    ),
    # Gemma 4 E2B-style: the last 2 of 6 layers share the keys and values of the last earlier layer
    # of their type (layer 4 layer 3's, layer 5 layer 2's), with FFNs twice as wide; no k_eq_v (the
    # global layers have their own values and 2 KV heads of 32); per-layer inputs 32 wide.
    "gemma4_kv_shared": (
        "Gemma4TextConfig",
        "Gemma4ForCausalLM",
        dict(
            vocab_size=262,
            hidden_size=64,
            intermediate_size=64,
            num_hidden_layers=6,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            global_head_dim=32,
            attention_k_eq_v=False,
            num_kv_shared_layers=2,
            use_double_wide_mlp=True,
            sliding_window=4,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
            hidden_size_per_layer_input=32,
            vocab_size_per_layer_input=262,
            final_logit_softcapping=30.0,
            max_position_embeddings=128,
        ),
    ),
    # GLM-4.x MoE: a dense first layer then 2 MoE layers; 8 experts in 4 groups, 2 groups used, top-3
    # (the group limit changes the choice), sigmoid scores chosen with a random correction bias,
    # renormalised then scaled by 2.5; 2 ungated shared experts; q/k norms, q/k/v biases, RoPE on
    # half of head_dim 32 (rotate-half); GQA 2:1; untied.
    "glm4_moe": (
        "Glm4MoeConfig",
        "Glm4MoeForCausalLM",
        dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            moe_intermediate_size=32,
            n_routed_experts=8,
            num_experts_per_tok=3,
            n_shared_experts=2,
            n_group=4,
            topk_group=2,
            first_k_dense_replace=1,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            use_qk_norm=True,
            attention_bias=True,
            partial_rotary_factor=0.5,
            max_position_embeddings=128,
            tie_word_embeddings=False,
        ),
    ),
    # OLMoE: q/k RMSNorm over all the heads' queries (64 wide) and all the keys (32: GQA 2:1), not per
    # head; 8 experts of 32, top-3, softmax weights not renormalised; every layer routed; untied.
    "olmoe": (
        "OlmoeConfig",
        "OlmoeForCausalLM",
        dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_experts=8,
            num_experts_per_tok=3,
            norm_topk_prob=False,
            max_position_embeddings=128,
            tie_word_embeddings=False,
        ),
    ),
    # Phi-3.5-MoE: LayerNorm with weights and biases, q/k/v/o biases, the output matrix's bias, a
    # sliding window (8) shorter than the decode, 8 experts routed by the sparsemixer, its jitter
    # 0.25 so that several logits fall within the mask's threshold (0.5) of the chosen one.
    "phimoe": (
        "PhimoeConfig",
        "PhimoeForCausalLM",
        dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_local_experts=8,
            num_experts_per_tok=2,
            router_jitter_noise=0.25,
            attention_bias=True,
            lm_head_bias=True,
            sliding_window=8,
            max_position_embeddings=128,
            tie_word_embeddings=False,
        ),
    ),
    # LFM2: its layers (LFM2_LAYERS: convolutions and attention, each twice); the FFN width adjusted
    # as Lfm2MLP does (2/3 of 144, times 1.5, rounded up to 32: 160).
    "lfm2": (
        "Lfm2Config",
        "Lfm2ForCausalLM",
        dict(
            LFM2_LAYERS,
            intermediate_size=144,
            block_auto_adjust_ff_dim=True,
            block_ffn_dim_multiplier=1.5,
            block_multiple_of=32,
        ),
    ),
    # LFM2-MoE: LFM2's layers (convolution and attention alternating), a dense first layer, then 8
    # experts top-2 by sigmoid scores chosen with a random expert_bias, renormalised (plus 1e-6) and
    # scaled by 1.5.
    "lfm2_moe": (
        "Lfm2MoeConfig",
        "Lfm2MoeForCausalLM",
        dict(
            LFM2_LAYERS,
            intermediate_size=96,
            moe_intermediate_size=32,
            num_experts=8,
            num_experts_per_tok=2,
            num_dense_layers=1,
            routed_scaling_factor=1.5,
            norm_topk_prob=True,
        ),
    ),
    # Multi-head latent attention: DeepSeek-V3's low-rank queries (q_lora_rank 32), a latent of 48 + a
    # RoPE key of 16 (a cached row of 64: whole q8_0 blocks), query heads of 16 + 16, value heads of
    # 24, interleaved RoPE with YaRN and its mscale_all_dim in the softmax scale; a dense first layer,
    # then V3's routing: 8 experts in 4 groups, 2 used, top-3, sigmoid with a correction bias,
    # renormalised and scaled by 2.5, one shared expert; untied.
    "deepseek_v3_mla": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=96,
            moe_intermediate_size=32,
            num_hidden_layers=3,
            first_k_dense_replace=1,
            n_routed_experts=8,
            num_experts_per_tok=3,
            n_group=4,
            topk_group=2,
            n_shared_experts=1,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            scoring_func="sigmoid",  # (as DeepSeek-V3's config.json says: llama.cpp's converter reads it)
            num_nextn_predict_layers=0,
            num_attention_heads=4,
            num_key_value_heads=4,
            q_lora_rank=32,
            kv_lora_rank=48,
            qk_nope_head_dim=16,
            qk_rope_head_dim=16,
            v_head_dim=24,
            max_position_embeddings=256,
            rope_interleave=True,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "original_max_position_embeddings": 64,
            },
            tie_word_embeddings=False,
        ),
    ),
    # DeepSeek-V2(-Lite)'s shape: queries straight from the hidden state (no q_lora_rank), the
    # complex RoPE of adjacent pairs, a latent of 32 + a RoPE key of 32, value heads of 16; a dense
    # first layer, then V2's group-limited greedy softmax routing (6 experts in 3 groups, 2 used,
    # top-2, scaled by 1.5) and 2 shared experts; tied.
    "deepseek_v2_mla": (
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=96,
            moe_intermediate_size=32,
            num_hidden_layers=3,
            first_k_dense_replace=1,
            n_routed_experts=6,
            num_experts_per_tok=2,
            topk_method="group_limited_greedy",
            n_group=3,
            topk_group=2,
            n_shared_experts=2,
            routed_scaling_factor=1.5,
            num_attention_heads=4,
            num_key_value_heads=4,
            q_lora_rank=None,
            kv_lora_rank=32,
            qk_nope_head_dim=32,
            qk_rope_head_dim=32,
            v_head_dim=16,
            max_position_embeddings=256,
            tie_word_embeddings=True,
        ),
    ),
    # GLM-4.7-Flash's latent attention: value heads (48) wider than the query heads' non-rotated part
    # (16), q_lora_rank 32, the latent 32 + 32; mlp_layer_types (a dense first layer, then V3's
    # routing without group limits: 6 experts top-2, one shared expert).
    "glm4_moe_lite_mla": (
        "Glm4MoeLiteConfig",
        "Glm4MoeLiteForCausalLM",
        dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=96,
            moe_intermediate_size=32,
            num_hidden_layers=3,
            mlp_layer_types=["dense", "sparse", "sparse"],
            n_routed_experts=6,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            n_shared_experts=1,
            routed_scaling_factor=1.8,
            norm_topk_prob=True,
            scoring_func="sigmoid",
            num_attention_heads=2,
            num_key_value_heads=2,
            q_lora_rank=32,
            kv_lora_rank=32,
            qk_nope_head_dim=16,
            qk_rope_head_dim=32,
            v_head_dim=48,
            max_position_embeddings=256,
            tie_word_embeddings=False,
        ),
    ),
    # Granite 4.0 hybrid, dense: Mamba-2 layers (8 heads of 16 in 2 groups, state 16, 4 taps) and
    # attention layers without RoPE, each twice; the shared MLP as the only FFN; every multiplier.
    "granite_hybrid": (
        "GraniteMoeHybridConfig",
        "GraniteMoeHybridForCausalLM",
        dict(GRANITE_HYBRID_LAYERS, num_local_experts=0, num_experts_per_tok=0, position_embedding_type=None),
    ),
    # Granite 4.0 hybrid MoE: the same layers with RoPE, 6 experts (top 2) beside the shared MLP, dt
    # clamped by time_step_limit.
    "granite_hybrid_moe": (
        "GraniteMoeHybridConfig",
        "GraniteMoeHybridForCausalLM",
        dict(
            GRANITE_HYBRID_LAYERS,
            num_local_experts=6,
            num_experts_per_tok=2,
            position_embedding_type="rope",
            time_step_limit=(0.05, 1.5),
        ),
    ),
    # Llama 4: RoPE layers 0 and 3 attend within chunks of 8 (shorter than the decode), their q/k
    # L2-normalised; layers 1 and 2 without RoPE see every position, their queries' temperature
    # rising every 8 positions (floor_scale 8); layers 1 and 3 route (8 experts, top-1 by sigmoid
    # scaling the expert's input, the shared expert beside them), 0 and 2 dense and wider.
    "llama4_text": (
        "Llama4TextConfig",
        "Llama4ForCausalLM",
        dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=32,
            intermediate_size_mlp=96,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_local_experts=8,
            num_experts_per_tok=1,
            interleave_moe_layer_step=2,
            no_rope_layers=[1, 0, 0, 1],
            attention_chunk_size=8,
            floor_scale=8,
            attn_scale=0.1,
            max_position_embeddings=128,
            tie_word_embeddings=False,
        ),
    ),
}
# Learned scales that default to 1 (Gemma 4's layer scalars, router scale, per-expert scales):
# randomised like the norms, so their paths are tested.
SCALES = ("layer_scalar", "router.scale", "router.per_expert_scale", "mamba.D")
# Biases that default to 0 and are buffers, not parameters (a router's correction bias): randomised too.
CHOICE_BIASES = ("e_score_correction_bias", "expert_bias")


def make_checkpoint(
    kind: str, out: Path, seed: int = 1234, dtype: str = "float32", max_shard_size: str | None = None
) -> Path:
    """Write a random-init checkpoint of ORACLE_CONFIGS[kind] (or a custom tuple) to `out`."""
    import torch
    import transformers

    config_cls, model_cls, kwargs = ORACLE_CONFIGS[kind] if isinstance(kind, str) else kind
    torch.manual_seed(seed)
    config = getattr(transformers, config_cls)(initializer_range=0.1, bos_token_id=1, eos_token_id=2, **kwargs)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        # Default init leaves norms at 1 and biases at 0; randomise them so those paths are tested.
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
        for name, b in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith(SCALES):
                b.copy_(1.0 + 0.2 * torch.randn_like(b))
            elif name.endswith(CHOICE_BIASES):
                b.copy_(0.1 * torch.randn_like(b))
    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    save_kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, safe_serialization=True, **save_kwargs)
    return out


def load_hf(model_dir: Path):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def transformers_logits(model_class, model_dir: Path, prompt: list[int], tokens: list[int]):
    """transformers' f32 logits (eager attention) at each position that chose one of the decoded
    tokens: the last of the prompt, then each token but the last."""
    import torch

    model = model_class.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1 :].numpy()


def make_gemma3_multimodal(out: Path, seed: int = 7) -> Path:
    """A tiny Gemma3ForConditionalGeneration (SigLIP vision tower + Gemma 3 text tower)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    text = dict(ORACLE_CONFIGS["gemma3_text"][2], num_hidden_layers=2, sliding_window=3)
    text.pop("rope_parameters")
    config = transformers.Gemma3Config(
        text_config=transformers.Gemma3TextConfig(initializer_range=0.1, **text),
        vision_config=transformers.SiglipVisionConfig(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=32,
            patch_size=16,
        ),
        mm_tokens_per_image=4,
        image_token_index=261,
        boi_token_index=259,
        eoi_token_index=260,
    )
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and "language_model" in name:
                p.copy_(0.2 * torch.randn_like(p))
    model.save_pretrained(out)
    return out


def make_gemma4_multimodal(out: Path, seed: int = 7) -> Path:
    """A tiny Gemma4ForConditionalGeneration: a one-layer vision tower beside the Gemma 4 text tower
    of "gemma4_text" (its norms and layer scalars randomised as make_checkpoint does)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    text = transformers.Gemma4TextConfig(
        initializer_range=0.1, bos_token_id=1, eos_token_id=2, **ORACLE_CONFIGS["gemma4_text"][2]
    )
    vision = transformers.Gemma4VisionConfig(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        patch_size=16,
        position_embedding_size=64,
    )
    config = transformers.Gemma4Config(
        text_config=text,
        vision_config=vision,
        audio_config=None,
        image_token_id=261,
        boi_token_id=259,
        eoi_token_id=260,
        video_token_id=258,
        boa_token_id=257,
        eoa_token_index=256,
        audio_token_id=255,
    )
    model = transformers.Gemma4ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            if "language_model" in name and ("norm" in name or name.endswith(SCALES)):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    model.save_pretrained(out)
    return out


# What make_upcycled_moe takes of kjv-tiny's config.json: everything but its MLP's kind.
KJV_SHAPE_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "rope_theta", "rms_norm_eps",
    "tie_word_embeddings", "bos_token_id", "eos_token_id",
)  # fmt: skip


def make_upcycled_moe(out: Path, experts: int = 8, top_k: int = 2, noise: float = 0.05, seed: int = 5) -> Path:
    """A Mixtral made from the bundled kjv-tiny (trained on the KJV): its embeddings, attention and
    norms, each layer's experts a copy of its MLP perturbed by `noise` (relative), and a random
    router. It writes the KJV-like text kjv-tiny writes, and routes each token by its hidden state:
    a MoE whose sampled decoding is text-like, so a stream sampled from it and a text fed to it
    route alike (tests of bench's token stream). Its tokenizer and generation settings are
    kjv-tiny's."""
    import json
    import shutil

    import torch
    import transformers
    from safetensors.torch import load_file

    kjv = Path(__file__).resolve().parent.parent / "models" / "kjv-tiny"
    src = load_file(str(kjv / "model.safetensors"))
    torch.manual_seed(seed)
    shape = json.loads((kjv / "config.json").read_text())  # kjv-tiny's own, so its weights fit
    config = transformers.MixtralConfig(
        **{key: shape[key] for key in KJV_SHAPE_KEYS},
        num_local_experts=experts,
        num_experts_per_tok=top_k,
        sliding_window=None,
    )
    model = transformers.MixtralForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in src:
                p.copy_(src[name])
            elif name.endswith("mlp.gate.weight"):
                p.copy_(0.3 * torch.randn_like(p))
            elif name.endswith("mlp.experts.gate_up_proj"):
                layer = name.split(".")[2]
                w = torch.cat(
                    [src[f"model.layers.{layer}.mlp.gate_proj.weight"], src[f"model.layers.{layer}.mlp.up_proj.weight"]]
                )
                p.copy_(w * (1 + noise * torch.randn_like(p)))
            elif name.endswith("mlp.experts.down_proj"):
                w = src[f"model.layers.{name.split('.')[2]}.mlp.down_proj.weight"]
                p.copy_(w * (1 + noise * torch.randn_like(p)))
            elif name != "lm_head.weight":
                raise AssertionError(f"kjv-tiny has no counterpart of {name}")
    model.save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(kjv / name, out / name)
    return out
