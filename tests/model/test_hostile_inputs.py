"""Hostile and broken inputs through the command line: each ends in one clear line, exit status 2,
no traceback and no output directory; strings from a model reach generated C only escaped."""

import json
import struct

import numpy as np
import pytest
from cli_runs import build_refused, cli_build_refused, model_copy
from conftest import run_cli

pytestmark = pytest.mark.slow  # each damaged checkpoint through the CLI


@pytest.fixture
def model(checkpoints, tmp_path):
    return model_copy(checkpoints, "qwen2_bias", tmp_path / "model")


def safetensors_parts(path):
    blob = path.read_bytes()
    (n,) = struct.unpack_from("<Q", blob)
    return json.loads(blob[8 : 8 + n]), blob[8 + n :]


def write_safetensors(path, header, data, header_len=None):
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if header_len is None else header_len) + text + data)


def edit_header(fn):
    def apply(model):
        path = model / "model.safetensors"
        header, data = safetensors_parts(path)
        header, data = fn(header, data)
        write_safetensors(path, header, data)

    return apply


def edit_config(fn):
    def apply(model):
        cfg = json.loads((model / "config.json").read_text())
        fn(cfg)
        (model / "config.json").write_text(json.dumps(cfg))

    return apply


def first(header):
    return next(k for k in header if k != "__metadata__")


def set_offsets(name_of, offsets):
    def fn(header, data):
        header[name_of(header)]["data_offsets"] = offsets(header[name_of(header)]["data_offsets"])
        return header, data

    return fn


def shift_all(n):
    def fn(header, data):
        for name, entry in header.items():
            if name != "__metadata__":
                entry["data_offsets"] = [o + n for o in entry["data_offsets"]]
        return header, b"\0" * n + data

    return fn


def raw(text):
    def apply(model):
        (model / "model.safetensors").write_bytes(text)

    return apply


DUPLICATE = (
    b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
)

CASES = {
    "header length 0": (raw(struct.pack("<Q", 0) + b"{}"), "too small"),
    "header length 7": (
        raw(struct.pack("<Q", 7) + b'{"a":1}'),
        "entry must have exactly dtype, shape and data_offsets",
    ),
    "header past the end": (raw(struct.pack("<Q", 1000) + b"{}"), "runs past the end"),
    "header over 100 MB": (raw(struct.pack("<Q", 200 * 2**20) + b"{}"), "exceeds"),
    "shorter than 8 bytes": (raw(b"\x01\x02"), "shorter than its 8-byte header length"),
    "header not UTF-8": (raw(struct.pack("<Q", 4) + b"\xff\xfe{}"), "not UTF-8"),
    "header not JSON": (raw(struct.pack("<Q", 4) + b"nope"), "not valid JSON"),
    "duplicate tensor name": (raw(struct.pack("<Q", len(DUPLICATE)) + DUPLICATE + b"\0" * 4), "duplicate key"),
    "unknown dtype": (
        edit_header(lambda h, d: (h.__setitem__(first(h), dict(h[first(h)], dtype="F8_E4M3")) or h, d)),
        "unsupported dtype",
    ),
    "offsets do not start at 0": (edit_header(shift_all(4)), "4 unused bytes before tensor"),
    "offsets end before they begin": (edit_header(set_offsets(first, lambda o: [o[1], o[0]])), "end before they begin"),
    "bytes do not match the shape": (
        edit_header(lambda h, d: (h.__setitem__(first(h), dict(h[first(h)], shape=[3, 5])) or h, d)),
        "do not hold shape",
    ),
    "shape product overflows": (
        edit_header(lambda h, d: (h.__setitem__(first(h), dict(h[first(h)], shape=[2**62, 2**62])) or h, d)),
        "do not hold shape",
    ),
    "trailing bytes": (edit_header(lambda h, d: (h, d + b"\0" * 8)), "trailing bytes"),
    "config NaN": (
        lambda m: (m / "config.json").write_text(
            (m / "config.json").read_text().replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": NaN')
        ),
        "not valid JSON",
    ),
    "config duplicate keys": (
        lambda m: (m / "config.json").write_text('{"vocab_size": 1, "vocab_size": 2}'),
        "duplicate key",
    ),
    "config boolean size": (edit_config(lambda c: c.update(hidden_size=True)), "must be an integer"),
    "config missing size": (edit_config(lambda c: c.pop("num_hidden_layers")), "missing required integer"),
    "config of 10^9 layers": (
        edit_config(lambda c: c.update(num_hidden_layers=10**9)),
        "'num_hidden_layers' is 1,000,000,000, more than the limit of 1,024",
    ),
    "heads do not divide hidden": (
        edit_config(lambda c: c.update(num_attention_heads=5, head_dim=None)),
        "not divisible by num_attention_heads",
    ),
    "KV heads do not divide heads": (
        edit_config(lambda c: c.update(num_key_value_heads=3)),
        "not divisible by num_key_value_heads",
    ),
    "vocab differs from embedding rows": (
        edit_config(lambda c: c.update(vocab_size=c["vocab_size"] + 1)),
        "config.json implies",
    ),
    "unknown rope scaling": (
        edit_config(lambda c: c.update(rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 1e4})),
        "unsupported rope type",
    ),
    "unsupported architecture": (
        edit_config(lambda c: c.update(architectures=["BertModel"])),
        "supported: LlamaForCausalLM",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_broken_model_is_refused_in_one_line(case, model, tmp_path):
    damage, message = CASES[case]
    damage(model)
    out = tmp_path / "out"
    line = cli_build_refused(model, out)
    assert message in line, line


def yarn(**change):
    """gpt-oss's rope_parameters with keys changed (None: removed)."""

    def fn(c):
        params = dict(c["rope_parameters"], **change)
        c["rope_parameters"] = {k: v for k, v in params.items() if v is not None}

    return edit_config(fn)


# gpt-oss's own keys, each broken alone on the random-init gpt-oss checkpoint.
GPT_OSS_CASES = {
    "sliding window 0": (edit_config(lambda c: c.update(sliding_window=0)), "'sliding_window' must be a positive"),
    "sliding window negative": (
        edit_config(lambda c: c.update(sliding_window=-4)),
        "'sliding_window' must be a positive",
    ),
    "layer_types too short": (
        edit_config(lambda c: c.update(layer_types=c["layer_types"][:3])),
        "'layer_types' must list one type per layer (4)",
    ),
    "layer type unknown": (
        edit_config(lambda c: c.update(layer_types=["linear_attention"] * 4)),
        "unsupported layer type 'linear_attention'",
    ),
    "more experts per token than experts": (
        edit_config(lambda c: c.update(num_experts_per_tok=9)),
        "num_experts_per_tok 9 exceeds the 8 experts",
    ),
    "experts 0": (edit_config(lambda c: c.update(num_local_experts=0)), "'num_local_experts' must be at least 1"),
    "swiglu limit 0": (edit_config(lambda c: c.update(swiglu_limit=0)), "'swiglu_limit' must be positive"),
    "swiglu alpha text": (edit_config(lambda c: c.update(swiglu_alpha="1.7")), "'swiglu_alpha' must be a finite"),
    "yarn without original length": (
        yarn(original_max_position_embeddings=None),
        "yarn rope needs a positive integer 'original_max_position_embeddings'",
    ),
    "yarn beta 0": (yarn(beta_fast=0.0), "'beta_fast' and 'beta_slow' must be positive"),
    "yarn truncate text": (yarn(truncate="no"), "'truncate' must be true or false"),
    "yarn attention factor negative": (yarn(attention_factor=-1.0), "'attention_factor' must be positive"),
    "experts narrower than the fused tensors": (
        edit_config(lambda c: c.update(intermediate_size=64)),
        "mlp.experts.down_proj' has shape [8, 96, 64], config.json implies [8, 64, 64]",
    ),
}


@pytest.mark.parametrize("case", sorted(GPT_OSS_CASES))
def test_broken_gpt_oss_config_is_refused_in_one_line(case, checkpoints, tmp_path):
    model = model_copy(checkpoints, "gpt_oss", tmp_path / "model")
    damage, message = GPT_OSS_CASES[case]
    damage(model)
    out = tmp_path / "out"
    line = cli_build_refused(model, out)
    assert message in line, line


def test_nan_in_weights_is_refused_without_output(model, tmp_path):
    path = model / "model.safetensors"
    header, data = safetensors_parts(path)
    name = "model.norm.weight"
    begin = header[name]["data_offsets"][0]
    data = data[:begin] + np.float32(np.inf).tobytes() + data[begin + 4 :]
    write_safetensors(path, header, data)
    done = run_cli("build", "--model", model, "--out", tmp_path / "out")
    assert done.returncode == 2 and "contains NaN or Inf" in done.stderr
    assert not (tmp_path / "out").exists(), "a rejected model left its build directory behind"


def test_a_rejected_model_leaves_an_earlier_build_of_the_same_directory_alone(model, tmp_path):
    out = tmp_path / "out"
    assert run_cli("build", "--model", model, "--out", out).returncode == 0
    path = model / "model.safetensors"
    header, data = safetensors_parts(path)
    begin = header["model.norm.weight"]["data_offsets"][0]
    write_safetensors(path, header, data[:begin] + np.float32(np.nan).tobytes() + data[begin + 4 :])
    done = run_cli("build", "--model", model, "--out", out)
    assert done.returncode == 2 and "contains NaN or Inf" in done.stderr
    assert (out / "firmware").is_file(), "the earlier build was removed"


@pytest.mark.parametrize(
    "index,message",
    [
        ({"weight_map": {"model.norm.weight": "../outside.safetensors"}}, "outside the model directory"),
        ({"weight_map": {"model.norm.weight": "missing.safetensors"}}, "does not exist"),
        (
            '{"weight_map": {"model.norm.weight": "model.safetensors", "model.norm.weight": "model.safetensors"}}',
            "duplicate key",
        ),
    ],
)
def test_broken_shard_index_is_refused(index, message, model, tmp_path):
    (model / "model.safetensors").rename(model / "shard.safetensors")
    text = index if isinstance(index, str) else json.dumps(index)
    (model / "model.safetensors.index.json").write_text(text)
    done = run_cli("build", "--model", model, "--out", tmp_path / "out")
    assert done.returncode == 2 and message in done.stderr, done.stderr


# A model directory's name cannot hold "/": "*/" goes into its path, the rest into its name.
HOSTILE_PARENT = "x*/"
HOSTILE = 'we"ird\\name\n{{ 7*7 }}*'


def test_c_literals_and_comments_survive_any_text():
    from generator.compile.emit import c_comment, c_string

    assert c_string('a"b\\c\n*/{{ 7*7 }}?') == '"a\\"b\\\\c\\012*/{{ 7*7 }}\\?"'
    assert c_comment("end */ here /* nested\nnext") == "end * / here / * nested?next"


def test_hostile_model_name_is_escaped_in_generated_c_and_compiles(checkpoints, tmp_path):
    model = model_copy(checkpoints, "qwen2_bias", tmp_path / HOSTILE_PARENT / HOSTILE)
    # A template in the model directory must never be rendered.
    (model / "model_def.h.j2").write_text("#error rendered a template from the model\n")
    out = tmp_path / "out"
    done = run_cli("verify", "--model", model, "--prompt-ids", "1,2", "--steps", "3", "--ctx", "16", "--out", out)
    assert done.returncode == 0, done.stderr
    header = (out / "generated" / "model_def.h").read_text()
    assert '#define COLIBRI_MODEL_NAME "we\\"ird\\\\name\\012{{ 7*7 }}*"' in header
    assert "49" not in header.split("COLIBRI_MODEL_NAME")[1].splitlines()[0]
    comment_line = next(line for line in header.splitlines() if line.startswith(" * Model:"))
    assert 'we"ird\\name?{{ 7*7 }}* (' in comment_line


# Qwen3.5-MoE's config keys (tests/models.py "qwen3_5_moe": layer_types of 3 linear_attention
# layers and 1 full_attention, 2 key and 4 value heads of 16, conv kernel 4, 8 experts top-2).
QWEN35_CASES = {
    "layer_types of the wrong length": (
        dict(layer_types=["linear_attention", "full_attention"]),
        "'layer_types' must list one type per layer (4)",
    ),
    "unknown layer type": (
        dict(layer_types=["linear_attention", "mamba", "linear_attention", "full_attention"]),
        'unsupported layer type "mamba" (supported: linear_attention, full_attention)',
    ),
    "no full-attention layer": (
        dict(layer_types=["linear_attention"] * 4),
        "'layer_types' has no full_attention layer (at least one is supported)",
    ),
    "zero heads": (dict(num_attention_heads=0), "'num_attention_heads' must be at least 1, got 0"),
    "zero key heads": (dict(linear_num_key_heads=0), "'linear_num_key_heads' must be at least 1, got 0"),
    "value heads not a multiple of key heads": (
        dict(linear_num_value_heads=3),
        "linear_num_value_heads 3 is not a multiple of linear_num_key_heads 2",
    ),
    "conv kernel 0": (dict(linear_conv_kernel_dim=0), "'linear_conv_kernel_dim' must be at least 1, got 0"),
    "key head dim not an integer": (dict(linear_key_head_dim=16.5), "'linear_key_head_dim' must be an integer"),
    "expert count 0": (dict(num_experts=0), "'num_experts' must be at least 1, got 0"),
    "more experts per token than experts": (dict(num_experts_per_tok=9), "num_experts_per_tok 9 exceeds the 8"),
    "partial rotary of under two dims": (
        dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.1}),
        "partial_rotary_factor 0.1 must rotate an even number",
    ),
    "value head width the weights do not have": (
        dict(linear_value_head_dim=8),
        "has shape [128, 64], config.json implies [96, 64]",
    ),
}


@pytest.mark.parametrize("case", sorted(QWEN35_CASES))
def test_broken_qwen35_config_is_refused_in_one_line(case, checkpoints, tmp_path, capsys):

    model = model_copy(checkpoints, "qwen3_5_moe", tmp_path / "model")
    change, message = QWEN35_CASES[case]
    edit_config(lambda c: c.update(change))(model)
    assert message in build_refused(capsys, model, tmp_path / "out")


# Gemma 4's config keys (tests/models.py "gemma4_moe": sliding and full_attention layers alternating,
# per_layer_config giving the full ones head_dim 32 and 1 KV head, k_eq_v, 8 experts top-2;
# "gemma4_text": per-layer inputs 32 wide), each broken alone.
GEMMA4_GLOBAL = {"head_dim": 32, "num_key_value_heads": 1}
GEMMA4_CASES = {
    "KV-sharing layers without a source": (
        "gemma4_moe",
        dict(num_kv_shared_layers=3),
        "layer 1 shares keys and values, but no earlier layer is full_attention (num_kv_shared_layers 3)",
    ),
    "more KV-sharing layers than layers": (
        "gemma4_moe",
        dict(num_kv_shared_layers=9),
        "num_kv_shared_layers 9 exceeds the 4 layers",
    ),
    "KV-sharing count text": (
        "gemma4_moe",
        dict(num_kv_shared_layers="2"),
        "'num_kv_shared_layers' must be an integer",
    ),
    "bidirectional attention": (
        "gemma4_moe",
        dict(use_bidirectional_attention="all"),
        "'use_bidirectional_attention' = \"all\" (bidirectional attention) is not supported",
    ),
    "per_layer_config not an object": (
        "gemma4_moe",
        dict(per_layer_config=[GEMMA4_GLOBAL]),
        "'per_layer_config' must be an object of layer overrides",
    ),
    "per_layer_config of a sliding layer": (
        "gemma4_moe",
        dict(per_layer_config={"0": GEMMA4_GLOBAL, "1": GEMMA4_GLOBAL, "3": GEMMA4_GLOBAL}),
        "supports head_dim and num_key_value_heads of full_attention layers only (layer 0)",
    ),
    "per_layer_config of another key": (
        "gemma4_moe",
        dict(per_layer_config={"1": dict(GEMMA4_GLOBAL, sliding_window=2), "3": GEMMA4_GLOBAL}),
        "supports head_dim and num_key_value_heads of full_attention layers only (layer 1)",
    ),
    "per_layer_config past the layers": (
        "gemma4_moe",
        dict(per_layer_config={"1": GEMMA4_GLOBAL, "9": GEMMA4_GLOBAL}),
        "'per_layer_config' key \"9\" is not a layer index",
    ),
    "global layers of two widths": (
        "gemma4_moe",
        dict(per_layer_config={"1": GEMMA4_GLOBAL, "3": dict(GEMMA4_GLOBAL, head_dim=64)}),
        "'per_layer_config' must give every full_attention layer the same shape",
    ),
    "odd global head width": (
        "gemma4_moe",
        dict(per_layer_config={"1": dict(GEMMA4_GLOBAL, head_dim=31), "3": dict(GEMMA4_GLOBAL, head_dim=31)}),
        "global head_dim 31 must be even",
    ),
    "global KV heads that do not divide the heads": (
        "gemma4_moe",
        dict(
            per_layer_config={
                "1": dict(GEMMA4_GLOBAL, num_key_value_heads=3),
                "3": dict(GEMMA4_GLOBAL, num_key_value_heads=3),
            }
        ),
        "num_attention_heads 4 is not divisible by the global layers' 3 KV heads",
    ),
    "global head width text": (
        "gemma4_moe",
        dict(per_layer_config=None, global_head_dim="32"),
        "'global_head_dim' must be an integer",
    ),
    "top k above the experts": ("gemma4_moe", dict(top_k_experts=9), "top_k_experts 9 exceeds the 8 experts"),
    "no expert width": (
        "gemma4_moe",
        dict(moe_intermediate_size=None),
        "missing required integer 'moe_intermediate_size'",
    ),
    "enable_moe_block text": ("gemma4_moe", dict(enable_moe_block="yes"), "'enable_moe_block' must be true or false"),
    "proportional rope rotating nothing": (
        "gemma4_moe",
        dict(
            rope_parameters={
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            }
        ),
        "proportional rope needs 0 < partial_rotary_factor <= 1",
    ),
    "values the checkpoint does not have": (
        "gemma4_moe",
        dict(attention_k_eq_v=False),
        "missing tensor for 'layers.1.wv'",
    ),
    "per-layer vocabulary of another size": (
        "gemma4_text",
        dict(vocab_size_per_layer_input=100),
        "'vocab_size_per_layer_input' must equal vocab_size (262)",
    ),
    "per-layer width the weights do not have": (
        "gemma4_text",
        dict(hidden_size_per_layer_input=16),
        "config.json implies [262, 96]",
    ),
}


# The keys of the families added as rows of the family table, each broken alone (kind: its
# checkpoint in tests/models.py).
ROW_CASES = {
    "OLMoE clipping queries, keys and values": (
        "olmoe",
        dict(clip_qkv=8.0),
        "'clip_qkv' = 8.0 (queries, keys and values clipped) is not supported for OlmoeForCausalLM",
    ),
    "OLMoE renormalising as text": ("olmoe", dict(norm_topk_prob="no"), "'norm_topk_prob' must be true or false"),
    "OLMoE top k above the experts": ("olmoe", dict(num_experts_per_tok=9), "num_experts_per_tok 9 exceeds the 8"),
    "Phi-3.5-MoE sparsemixer of 3": (
        "phimoe",
        dict(num_experts_per_tok=3),
        "num_experts_per_tok 3: the sparsemixer router picks exactly 2 experts",
    ),
    "Phi-3.5-MoE jitter negative": (
        "phimoe",
        dict(router_jitter_noise=-0.1),
        "the sparsemixer's router_jitter_noise must not be negative, got -0.1",
    ),
    "Phi-3.5-MoE jitter text": ("phimoe", dict(router_jitter_noise="0.01"), "'router_jitter_noise' must be a finite"),
    "Phi-3.5-MoE output bias as text": ("phimoe", dict(lm_head_bias="yes"), "'lm_head_bias' must be true or false"),
    "Llama 4 chunk size 0": (
        "llama4_text",
        dict(attention_chunk_size=0),
        "'attention_chunk_size' must be at least 1, got 0",
    ),
    "Llama 4 no_rope_layers of the wrong length": (
        "llama4_text",
        dict(no_rope_layers=[1, 0, 0]),
        "'no_rope_layers' lists 3 layers, the model has 4",
    ),
    "Llama 4 no_rope_layers not 0 or 1": (
        "llama4_text",
        dict(no_rope_layers=[1, 2, 0, 1]),
        "'no_rope_layers' must list 1 (RoPE) or 0 (no RoPE) for each layer",
    ),
    "Llama 4 MoE layer past the last": (
        "llama4_text",
        dict(moe_layers=[1, 4]),
        "'moe_layers' must list layer indices from 0 to 3",
    ),
    "Llama 4 temperature tuning as text": (
        "llama4_text",
        dict(attn_temperature_tuning="yes"),
        "'attn_temperature_tuning' must be true or false, got \"yes\"",
    ),
    "Llama 4 chunked layers without a chunk size": (
        "llama4_text",
        dict(attention_chunk_size=None),
        "chunked_attention layers need 'attention_chunk_size'",
    ),
    # LFM2's config keys (tests/models.py "lfm2": conv and full_attention layers alternating, 3 taps),
    # each broken alone.
    "LFM2 unknown layer type": (
        "lfm2",
        dict(layer_types=["conv", "mamba", "conv", "full_attention"]),
        'unsupported layer type "mamba" (supported: conv, full_attention)',
    ),
    "LFM2 conv_L_cache 0": ("lfm2", dict(conv_L_cache=0), "'conv_L_cache' must be at least 1, got 0"),
    "LFM2 conv biases": (
        "lfm2",
        dict(conv_bias=True),
        "'conv_bias' true (biases in the short convolution) is not supported",
    ),
    "LFM2 more taps than the weights have": (
        "lfm2",
        dict(conv_L_cache=4),
        "has shape [64, 1, 3], config.json implies [64, 1, 4]",
    ),
    # Granite 4.0 hybrid's config keys (tests/models.py "granite_hybrid": Mamba-2 and attention layers
    # alternating, 8 Mamba heads in 2 groups over an inner width of 128), each broken alone.
    "Granite hybrid unknown layer type": (
        "granite_hybrid",
        dict(layer_types=["mamba", "conv", "mamba", "attention"]),
        'unsupported layer type "conv" (supported: mamba, linear_attention, attention, full_attention)',
    ),
    "Granite hybrid heads not dividing the inner width": (
        "granite_hybrid",
        dict(mamba_n_heads=6, mamba_d_head="auto"),
        "mamba_n_heads 6 does not divide the Mamba inner width 128",
    ),
    "Granite hybrid groups not dividing the heads": (
        "granite_hybrid",
        dict(mamba_n_groups=3),
        "mamba_n_groups 3 does not divide the 8 Mamba heads",
    ),
}


# Latent attention's config keys (tests/models.py "deepseek_v3_mla": hidden 64, latent 48 + RoPE 16;
# "glm4_moe_lite_mla": mlp_layer_types), each broken alone.
LATENT_CASES = {
    "no latent": ("deepseek_v3_mla", dict(kv_lora_rank=0), "'kv_lora_rank' must be at least 1 for latent attention"),
    "latent wider than the hidden size": (
        "deepseek_v3_mla",
        dict(kv_lora_rank=80),
        "'kv_lora_rank' 80 is wider than the hidden size 64",
    ),
    "odd RoPE key": ("deepseek_v3_mla", dict(qk_rope_head_dim=15), "'qk_rope_head_dim' must be a positive even"),
    "GLM layer types of another length": (
        "glm4_moe_lite_mla",
        dict(mlp_layer_types=["dense", "sparse"]),
        '\'mlp_layer_types\' must say "dense" or "sparse" for each of the 3 layers',
    ),
    "value heads the weights do not have": (
        "deepseek_v3_mla",
        dict(v_head_dim=16),
        "kv_b_proj.weight' has shape [160, 48], config.json implies [128, 48]",
    ),
}
FAMILY_CASES = {**GEMMA4_CASES, **ROW_CASES, **LATENT_CASES}


@pytest.mark.parametrize("case", sorted(FAMILY_CASES))
def test_broken_family_config_is_refused_in_one_line(case, checkpoints, tmp_path, capsys):
    kind, change, message = FAMILY_CASES[case]
    model = model_copy(checkpoints, kind, tmp_path / "model")
    edit_config(lambda c: c.update(change))(model)
    line = build_refused(capsys, model, tmp_path / "out")
    assert message in line, line


def wrong_length_choice_bias(model):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(model / "model.safetensors")
    tensors["model.layers.1.mlp.gate.e_score_correction_bias"] = np.zeros(7, np.float32)
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})


# The DeepSeek line's routing keys (tests/models.py "glm4_moe": 8 experts in 4 groups, 2 used, top-3),
# each broken alone.
GLM4_MOE_CASES = {
    "groups that do not divide the experts": (
        edit_config(lambda c: c.update(n_group=3)),
        "n_group 3 does not divide the 8 experts into equal groups",
    ),
    "more groups used than groups": (
        edit_config(lambda c: c.update(topk_group=5)),
        "topk_group 5 must be from 1 to n_group 4",
    ),
    "more experts per token than the groups hold": (
        edit_config(lambda c: c.update(topk_group=1)),
        "num_experts_per_tok 3 exceeds the 2 experts that topk_group 1 groups of 2 hold",
    ),
    "groups of one expert": (
        edit_config(lambda c: c.update(n_group=8, topk_group=4)),
        "a group scores its two best experts, but n_group 8 leaves 1 a group",
    ),
    "routed scaling 0": (
        edit_config(lambda c: c.update(routed_scaling_factor=0)),
        "'routed_scaling_factor' must be positive",
    ),
    "correction bias of the wrong length": (
        wrong_length_choice_bias,
        "tensor 'model.layers.1.mlp.gate.e_score_correction_bias' has shape [7], config.json implies [8]",
    ),
}


@pytest.mark.parametrize("case", sorted(GLM4_MOE_CASES))
def test_broken_glm4_moe_routing_is_refused_in_one_line(case, checkpoints, tmp_path, capsys):
    damage, message = GLM4_MOE_CASES[case]
    damage(model_copy(checkpoints, "glm4_moe", tmp_path / "model"))
    assert message in build_refused(capsys, tmp_path / "model", tmp_path / "out")
