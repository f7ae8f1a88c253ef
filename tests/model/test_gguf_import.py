"""GGUF in: a checkpoint converted to GGUF the way llama.cpp converts it imports to the same
ModelSpec and, bit for bit, the same tensors as its safetensors; quantized tensors decode with
llama.cpp's formulas (the gguf package is the oracle) and keep their exact blocks; the firmware
built from a .gguf file passes verify."""

import dataclasses
import re

import numpy as np
import pytest
from conftest import run_cli
from gguf_files import hf_to_gguf, permute

from generator.model.gguf.file import read_gguf
from generator.model.gguf.load import load_gguf, unpermute_order
from generator.model.gguf.tensors import tensor_blocks, tensor_f32
from generator.model.load import load_model
from models import ORACLE_CONFIGS, make_checkpoint

pytestmark = pytest.mark.slow  # GGUF files of every family built and compared

# What a GGUF file can say: llama.cpp keeps no sliding window for llama-architecture (Mixtral)
# files, and no query_pre_attn_scalar or final softcap for Gemma 3 (it uses 1/sqrt(head_dim)).
CONFIGS = {
    "llama_gqa_linear": ORACLE_CONFIGS["llama_gqa_linear"],
    "llama3_rope_bias_default_rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(ORACLE_CONFIGS["llama3_rope_bias"][2], rope_scaling=None),
    ),
    "qwen2_bias": ORACLE_CONFIGS["qwen2_bias"],
    "qwen3_qknorm": ORACLE_CONFIGS["qwen3_qknorm"],
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(ORACLE_CONFIGS["gemma3_text"][2], query_pre_attn_scalar=32, final_logit_softcapping=None),
    ),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(ORACLE_CONFIGS["mixtral_moe"][2], sliding_window=None)),
    "qwen2_moe_shared": ORACLE_CONFIGS["qwen2_moe_shared"],
    "qwen3_moe": ORACLE_CONFIGS["qwen3_moe"],
}


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """(kind, GGUF type) -> (HF checkpoint directory, .gguf file), made on first use."""
    root = tmp_path_factory.mktemp("gguf")
    made = {}

    def get(kind: str, tensor_type: str = "F32"):
        if kind not in made:
            made[kind] = make_checkpoint(CONFIGS[kind], root / kind)
        key = (kind, tensor_type)
        if key not in made:
            made[key] = hf_to_gguf(made[kind], root / f"{kind}-{tensor_type}.gguf", tensor_type)
        return made[kind], made[key]

    return get


def bits(a):
    """The float32 bit patterns of an array, or of a checkpoint tensor read whole."""
    a = a.load() if hasattr(a, "load") else a
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_an_f32_gguf_imports_as_its_safetensors_do(kind, converted):
    hf_dir, path = converted(kind)
    from_hf, from_gguf = load_model(hf_dir), load_model(path)
    assert dataclasses.replace(from_gguf.spec, name=from_hf.spec.name) == from_hf.spec
    assert from_gguf.spec.name == path.stem
    assert list(from_gguf.tensors) == list(from_hf.tensors)
    differ = [n for n in from_hf.tensors if not np.array_equal(bits(from_hf.tensors[n]), bits(from_gguf.tensors[n]))]
    assert differ == []
    assert from_gguf.input_files == [path]


def test_the_llama_q_k_permutation_is_undone_for_every_head_count():
    rng = np.random.default_rng(0)
    for heads, kv_heads, head_dim in ((2, 1, 48), (9, 3, 64), (8, 8, 4), (4, 2, 2)):
        for n, rows_heads in ((heads, (heads, heads)), (kv_heads, (heads, kv_heads))):
            w = rng.standard_normal((n * head_dim, 5)).astype(np.float32)
            stored = permute(w, *rows_heads)
            assert not np.array_equal(stored, w) or head_dim == 2
            assert np.array_equal(stored[unpermute_order(len(w), n)], w)


@pytest.mark.parametrize("tensor_type", ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_quantized_tensors_decode_as_the_gguf_package_decodes_them(tensor_type, converted):
    import gguf

    hf_dir, path = converted("llama_gqa_linear", tensor_type)
    qtype = gguf.GGMLQuantizationType[tensor_type]
    reader = gguf.GGUFReader(path)
    parsed = read_gguf(path)
    for t in reader.tensors:
        expected = gguf.quants.dequantize(t.data, t.tensor_type)
        assert np.array_equal(bits(tensor_f32(parsed, parsed.tensors[t.name])), bits(expected)), t.name
    # Row blocks survive the permutation: the imported q/k weights are the HF weights quantized.
    from_hf, from_gguf = load_model(hf_dir), load_gguf(path)
    for name in ("layers.0.wq", "layers.1.wk", "embed", "lm_head"):
        roundtrip = gguf.quants.dequantize(gguf.quants.quantize(from_hf.tensors[name].load(), qtype), qtype)
        assert np.array_equal(bits(from_gguf.tensors[name]), bits(roundtrip)), name
    assert from_gguf.tensor_types["layers.0.wq"] == tensor_type
    assert from_gguf.tensor_types["layers.0.attn_norm"] == "F32"


def write_random_blocks(path, tensor_type: str, rows: int = 3, cols: int = 512):
    """A file with one tensor of random blocks whose fp16 scale fields are finite and small."""
    import gguf

    qtype = gguf.GGMLQuantizationType[tensor_type]
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(len(tensor_type) + rows)
    raw = rng.integers(0, 256, (rows * cols // block, block_bytes), dtype=np.uint8)
    # Every fp16 field of these types (d, dmin; Q6_K's d is its last 2 bytes) set to a finite value.
    fp16_at = {
        "Q6_K": [block_bytes - 2],
        "Q2_K": [block_bytes - 4, block_bytes - 2],
        "Q3_K": [block_bytes - 2],
        "Q8_0": [0],
        "Q4_0": [0],
    }.get(tensor_type, [0, 2])
    for at in fp16_at:
        raw[:, at : at + 2] = rng.uniform(-0.1, 0.1, len(raw)).astype("<f2").view(np.uint8).reshape(-1, 2)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("t", raw.reshape(rows, -1), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return read_gguf(path)


@pytest.mark.parametrize(
    "tensor_type", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K"]
)
def test_every_block_type_decodes_bit_for_bit_like_llama_cpp(tensor_type, tmp_path):
    import gguf

    parsed = write_random_blocks(tmp_path / "t.gguf", tensor_type)
    info = parsed.tensors["t"]
    reader = gguf.GGUFReader(tmp_path / "t.gguf")
    expected = gguf.quants.dequantize(reader.tensors[0].data, reader.tensors[0].tensor_type)
    assert np.array_equal(bits(tensor_f32(parsed, info)), bits(expected))


@pytest.mark.parametrize(
    "tensor_type,q_range,has_offsets",
    [("Q8_0", (-128, 127), False), ("Q4_0", (-8, 7), False), ("Q4_1", (0, 15), True), ("Q4_K", (0, 15), True)],
)
def test_q8_0_q4_0_q4_1_q4_k_blocks_are_kept_exactly(tensor_type, q_range, has_offsets, tmp_path):
    parsed = write_random_blocks(tmp_path / "t.gguf", tensor_type)
    info = parsed.tensors["t"]
    blocks = tensor_blocks(parsed, info)
    assert blocks.ggml_type == tensor_type and blocks.shape == info.shape == (3, 512)
    assert blocks.quants.dtype == np.int8 and blocks.scales.dtype == np.float32
    assert blocks.quants.min() == q_range[0] and blocks.quants.max() == q_range[1]
    assert blocks.scales.shape == (3, 16) and (blocks.offsets is not None) == has_offsets
    assert np.array_equal(bits(blocks.dequantize()), bits(tensor_f32(parsed, info)))
    if tensor_type != "Q4_K":  # the scale is the block's fp16 field itself
        assert np.array_equal(blocks.scales, blocks.scales.astype(np.float16).astype(np.float32))


def test_other_types_have_no_exact_blocks(tmp_path):
    parsed = write_random_blocks(tmp_path / "t.gguf", "TQ2_0")
    assert tensor_blocks(parsed, parsed.tensors["t"]) is None


@pytest.mark.parametrize(
    "tensor_type", ["Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q3_K", "Q2_K", "IQ4_NL", "IQ4_XS", "MXFP4"]
)
def test_verbatim_types_keep_the_files_bytes(tensor_type, tmp_path):
    parsed = write_random_blocks(tmp_path / "t.gguf", tensor_type)
    info = parsed.tensors["t"]
    with open(tmp_path / "t.gguf", "rb") as f:
        f.seek(info.begin)
        file_bytes = np.frombuffer(f.read(info.end - info.begin), np.uint8)
    assert np.array_equal(tensor_blocks(parsed, info).block_bytes(), file_bytes)


def test_a_q4_1_gguf_keeps_its_blocks_under_canonical_names(converted):
    _, path = converted("llama_gqa_linear", "Q4_1")
    checkpoint = load_gguf(path)
    for name in ("layers.0.wq", "layers.0.wk", "layers.1.w_down", "embed"):
        blocks = checkpoint.blocks(name)
        assert blocks.ggml_type == "Q4_1"
        assert np.array_equal(bits(blocks.dequantize()), bits(checkpoint.tensors[name])), name
    assert checkpoint.blocks("final_norm") is None


def test_mixtral_experts_keep_their_blocks_per_expert(converted):
    _, path = converted("mixtral", "Q8_0")
    checkpoint = load_gguf(path)
    for name in ("layers.0.experts.0.w_gate", "layers.1.experts.3.w_down", "layers.0.router"):
        assert np.array_equal(bits(checkpoint.blocks(name).dequantize()), bits(checkpoint.tensors[name])), name


def test_planning_reads_only_the_header(converted):
    _, path = converted("qwen3_moe")
    checkpoint = load_model(path, load_tensors=False)
    assert checkpoint.tensors == {} and checkpoint.spec.n_experts == 8


@pytest.mark.parametrize("tensor_type,quant", [("Q8_0", "q8_0"), ("Q4_1", "q4_0")])
def test_verify_passes_on_a_gguf_model(tensor_type, quant, converted, tmp_path):
    _, path = converted("llama_gqa_linear", tensor_type)
    out = tmp_path / "out"
    done = run_cli(
        "verify",
        "--board",
        "host",
        "--model",
        path,
        "--quant",
        quant,
        "--prompt-ids",
        "1,5,9",
        "--steps",
        "6",
        "--ctx",
        "16",
        "--out",
        out,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS" in done.stdout


# gpt-oss as llama.cpp's own converter writes it: the gpt_oss_peer fixture (tests/conftest.py).


def test_gpt_oss_converted_by_llama_cpp_imports_as_its_safetensors_do(gpt_oss_peer):
    model_dir, files = gpt_oss_peer
    from_hf, from_gguf = load_model(model_dir), load_model(files["f32"])
    spec = from_hf.spec
    assert spec.family == "gpt_oss" and spec.attn_sinks and spec.router == "topk_then_softmax"
    assert spec.layer_windows == (4, 0, 4, 0) and spec.rope.scaling == "yarn"
    assert dataclasses.replace(from_gguf.spec, name=spec.name) == spec
    assert list(from_gguf.tensors) == list(from_hf.tensors)
    # Every tensor, the de-interleaved and transposed experts and their stacked biases included.
    differ = [n for n in from_hf.tensors if not np.array_equal(bits(from_hf.tensors[n]), bits(from_gguf.tensors[n]))]
    assert differ == []
    # The q8_0 file: the experts' and attention's blocks kept as the converter wrote them.
    q8 = load_gguf(files["q8_0"])
    assert q8.tensor_types["layers.1.experts.5.w_down"] == "Q8_0" and q8.tensor_types["layers.1.sinks"] == "F32"
    assert dataclasses.replace(q8.spec, name=spec.name) == spec


def test_verify_passes_on_gpt_oss_converted_by_llama_cpp_with_its_q8_0_blocks_kept(gpt_oss_peer, tmp_path):
    _, files = gpt_oss_peer
    done = run_cli(
        "verify",
        "--board",
        "host",
        "--model",
        files["q8_0"],
        "--quant",
        "gguf",
        "--prompt-ids",
        "1,5,9,200,7",
        "--steps",
        "10",
        "--ctx",
        "32",
        "--out",
        tmp_path / "out",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS" in done.stdout


# GLM-4.x MoE as llama.cpp's converter writes it (glm4moe): block_count counts the
# multi-token-prediction layer (nextn_predict_layers), the sigmoid routing's keys
# (expert_gating_func, expert_group_count, expert_weights_scale), exp_probs_b, the shared experts.


@pytest.fixture(scope="module")
def glm4_moe_peer(tmp_path_factory):
    from gguf_files import peer_convert

    config_cls, model_cls, kwargs = ORACLE_CONFIGS["glm4_moe"]
    root = tmp_path_factory.mktemp("glm4-moe-peer")
    model_dir = make_checkpoint((config_cls, model_cls, dict(kwargs, vocab_size=512)), root / "model")
    return model_dir, peer_convert(model_dir, root / "glm4-moe-f32.gguf", "f32")


def test_glm4_moe_converted_by_llama_cpp_imports_as_its_safetensors_do(glm4_moe_peer):
    model_dir, path = glm4_moe_peer
    from_hf, from_gguf = load_model(model_dir), load_model(path)
    spec = from_hf.spec
    assert read_gguf(path).metadata["glm4moe.block_count"] == spec.n_layers + 1 and spec.mtp_layers == 1
    assert (spec.expert_groups, spec.routed_scaling, spec.router_choice_bias) == (4, 2.5, True)
    assert dataclasses.replace(from_gguf.spec, name=spec.name) == spec
    assert list(from_gguf.tensors) == list(from_hf.tensors)
    differ = [n for n in from_hf.tensors if not np.array_equal(bits(from_hf.tensors[n]), bits(from_gguf.tensors[n]))]
    assert differ == []


# DeepSeekMoE (llama.cpp's deepseek): no transformers class, so its checkpoint is written here from
# seeded tensors in the shape of its modeling code (plain multi-head attention, a dense first layer,
# 8 fine-grained experts top-3 by softmax, not renormalised, 2 ungated shared experts) and converted
# as convert_hf_to_gguf.py's DeepseekModel does (gguf_files.hf_to_gguf: q/k permuted, experts stacked).
DEEPSEEK_MOE = dict(
    architectures=["DeepseekForCausalLM"], vocab_size=256, hidden_size=64, intermediate_size=96,
    moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
    n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=2, first_k_dense_replace=1, moe_layer_freq=1,
    norm_topk_prob=False, scoring_func="softmax", max_position_embeddings=128, rms_norm_eps=1e-6,
    rope_theta=10000.0, attention_bias=False, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
)  # fmt: skip


def make_deepseek_moe(out, seed=3):
    import json

    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    c = DEEPSEEK_MOE
    d, f, fe, v = c["hidden_size"], c["intermediate_size"], c["moe_intermediate_size"], c["vocab_size"]

    def mat(rows, cols):
        return (0.1 * rng.standard_normal((rows, cols))).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    def mlp(prefix, width):
        return {f"{prefix}.gate_proj.weight": mat(width, d), f"{prefix}.up_proj.weight": mat(width, d),
                f"{prefix}.down_proj.weight": mat(d, width)}  # fmt: skip

    tensors = {"model.embed_tokens.weight": mat(v, d), "model.norm.weight": norm(d), "lm_head.weight": mat(v, d)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors.update({p + "input_layernorm.weight": norm(d), p + "post_attention_layernorm.weight": norm(d)})
        tensors.update({p + f"self_attn.{x}_proj.weight": mat(d, d) for x in "qkvo"})
        if i < c["first_k_dense_replace"]:
            tensors.update(mlp(p + "mlp", f))
            continue
        tensors[p + "mlp.gate.weight"] = mat(c["n_routed_experts"], d)
        tensors.update(mlp(p + "mlp.shared_experts", fe * c["n_shared_experts"]))
        for e in range(c["n_routed_experts"]):
            tensors.update(mlp(p + f"mlp.experts.{e}", fe))
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(c))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def deepseek_moe(tmp_path_factory):
    """The DeepSeekMoE checkpoint and its GGUF files {type: path}, F32 and Q8_0."""
    root = tmp_path_factory.mktemp("deepseek-moe")
    model_dir = make_deepseek_moe(root / "model")
    return model_dir, {t: hf_to_gguf(model_dir, root / f"deepseek-moe-{t}.gguf", t) for t in ("F32", "Q8_0")}


def test_deepseek_moe_gguf_imports_as_its_checkpoint_does(deepseek_moe):
    model_dir, files = deepseek_moe
    from_hf, from_gguf = load_model(model_dir), load_model(files["F32"])
    spec = from_hf.spec
    assert spec.family == "deepseek" and spec.moe_layers == (False, True, True) and not spec.norm_topk_prob
    assert spec.router == "softmax_then_topk" and spec.shared_expert_intermediate_size == 64
    assert spec.ungated_shared_expert
    assert dataclasses.replace(from_gguf.spec, name=spec.name) == spec
    assert list(from_gguf.tensors) == list(from_hf.tensors)
    differ = [n for n in from_hf.tensors if not np.array_equal(bits(from_hf.tensors[n]), bits(from_gguf.tensors[n]))]
    assert differ == []  # the q/k rows un-permuted, the stacked experts split


def test_verify_passes_on_deepseek_moe_with_its_q8_0_blocks_kept(deepseek_moe, tmp_path):
    _, files = deepseek_moe
    done = run_cli(
        "verify", "--board", "host", "--model", files["Q8_0"], "--quant", "gguf", "--prompt-ids", "1,17,42,99,7",
        "--steps", "12", "--ctx", "32", "--temperature", "0.9", "--seed", "3", "--out", tmp_path / "out",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS" in done.stdout


@pytest.mark.parametrize(
    "key, value, message",
    [
        (
            "glm4moe.expert_gating_func",
            1,
            "metadata 'glm4moe.expert_gating_func' 1 is not this architecture's sigmoid (2)",
        ),
        ("glm4moe.expert_group_count", 3, "expert_group_count 3 does not divide the 8 experts into equal groups"),
        (
            "glm4moe.expert_group_used_count",
            1,
            "expert_used_count 3 exceeds the 2 experts that expert_group_used_count",
        ),
    ],
)
def test_broken_glm4_moe_routing_keys_are_refused_in_one_line(key, value, message, glm4_moe_peer, tmp_path):
    from gguf_files import with_u32_key

    from generator.errors import ColibriError

    path = with_u32_key(glm4_moe_peer[1], key, value, tmp_path / "broken.gguf")
    with pytest.raises(ColibriError, match=re.escape(message)):
        load_model(path)
