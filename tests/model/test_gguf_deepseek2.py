"""Latent attention from GGUF (llama.cpp's deepseek2): the checkpoints of tests/models.py
"deepseek_v3_mla" (low-rank queries, YaRN with its mscale, V3's sigmoid routing: its file names the
sigmoid gating, so it is V3's row), "deepseek_v2_mla" (V2's grouped softmax routing) and
"glm4_moe_lite_mla" (GLM-4.7-Flash: a deepseek2 file with V3's gating and GLM's vocabulary, so
GLM-4.7-Flash's row), converted by the
peer's own convert_hf_to_gguf.py (the newer files: attn_k_b and attn_v_b split), and the same files
rewritten in the older form (attn_kv_b whole, the heads' widths in key/value_length), import to the
same ModelSpec and bit-identical tensors as their safetensors; the Q8_0 file's firmware keeps its
blocks and decodes the reference's bits. Damaged files are refused in one line."""

import struct

import numpy as np
import pytest
from cli_runs import build_refused
from gguf_files import assert_damaged_key_refused, assert_imports_alike

from generator.model.load import load_model
from generator.numerics.sampling import SamplingParams
from generator.verify import compare, reference_run

pytestmark = pytest.mark.slow  # the peer's converter runs four times, firmware is built (about 45 s)

PROMPT = [1, 17, 42, 99, 7, 3, 250]
# (GLM-4.7-Flash: deepseek2 too, with sigmoid gating as V3's, told apart by its GLM vocabulary)
KINDS = ("deepseek_v3_mla", "deepseek_v2_mla", "glm4_moe_lite_mla")
F32 = 0  # GGML type id


@pytest.fixture(scope="module")
def deepseek2_peer(tmp_path_factory):
    """Each kind at vocab 512 (kjv-tiny's tokenizer, which the converter needs), its .gguf files as
    llama.cpp writes them (f32, and q8_0 for V3) and the f32 file in the older, unsplit form."""
    from gguf_files import peer_convert

    from models import ORACLE_CONFIGS, make_checkpoint

    out = {}
    for kind in KINDS:
        config_cls, model_cls, kwargs = ORACLE_CONFIGS[kind]
        root = tmp_path_factory.mktemp(kind + "-peer")
        model_dir = make_checkpoint((config_cls, model_cls, dict(kwargs, vocab_size=512)), root / "model")
        types = ("f32", "q8_0") if kind == "deepseek_v3_mla" else ("f32",)
        files = {t: peer_convert(model_dir, root / f"{kind}-{t}.gguf", t) for t in types}
        files["unsplit"] = unsplit(files["f32"], model_dir, root / f"{kind}-unsplit.gguf")
        out[kind] = model_dir, files
    return out


def unsplit(source, model_dir, out):
    """source rewritten as llama.cpp's files before the split: every layer's attn_kv_b (kv_b_proj as
    the checkpoint holds it) instead of attn_k_b and attn_v_b, the heads' widths in key_length and
    value_length, a KV head per head, no *_mla keys."""
    from gguf_files import U32, kv, raw_gguf
    from safetensors.numpy import load_file

    weights = load_file(str(model_dir / "model.safetensors"))
    raw = raw_gguf(source)
    meta = {e[8 : 8 + struct.unpack_from("<Q", e)[0]].decode(): e for e in raw.kvs}

    def u32(key):
        entry = meta[key]
        return struct.unpack_from("<I", entry, len(entry) - 4)[0]

    heads, nope_rope, v = (
        u32("deepseek2.attention.head_count"),
        u32("deepseek2.attention.key_length_mla"),
        u32("deepseek2.attention.value_length_mla"),
    )
    changed = {
        "deepseek2.attention.key_length": nope_rope,
        "deepseek2.attention.value_length": v,
        "deepseek2.attention.head_count_kv": heads,
    }
    raw.kvs = [e for k, e in meta.items() if k not in changed and not k.endswith("_mla")]
    raw.kvs += [kv(k, U32, struct.pack("<I", value)) for k, value in changed.items()]
    data = bytearray(raw.data)
    infos = [i for i in raw.infos if not i[0].endswith(("attn_k_b.weight", "attn_v_b.weight"))]
    for layer in sorted({int(i[0].split(".")[1]) for i in raw.infos if i[0].endswith("attn_k_b.weight")}):
        kv_b = np.ascontiguousarray(weights[f"model.layers.{layer}.self_attn.kv_b_proj.weight"], dtype="<f4")
        data += bytes(-len(data) % raw.alignment)
        infos.append([f"blk.{layer}.attn_kv_b.weight", [kv_b.shape[1], kv_b.shape[0]], F32, len(data)])
        data += kv_b.tobytes()
    raw.infos, raw.data = infos, bytes(data)
    out.write_bytes(raw.encode())
    return out


@pytest.mark.parametrize("form", ["f32", "unsplit"])
@pytest.mark.parametrize("kind", KINDS)
def test_converted_by_llama_cpp_imports_as_its_safetensors_do(kind, form, deepseek2_peer):
    model_dir, files = deepseek2_peer[kind]
    from_hf, from_gguf = load_model(model_dir), load_model(files[form])
    spec = from_hf.spec
    assert spec.kv_lora_rank and spec.rope_dim
    assert spec.n_experts and (spec.expert_groups or spec.family == "glm4_moe_lite")  # (GLM: one group)
    assert_imports_alike(from_hf, from_gguf)


def test_firmware_from_the_q8_0_gguf_keeps_its_blocks_and_decodes_the_reference_bits(deepseek2_peer, builder):
    _, files = deepseek2_peer["deepseek_v3_mla"]
    sampling = SamplingParams(0.9, top_k=40, top_p=0.95, seed=11)
    art, plan, request, result = builder.run(files["q8_0"], PROMPT, 10, quant="gguf", sampling=sampling)
    assert compare(result, reference_run(plan, art.weights, request)).passed
    exact, _ = plan.gguf_kept()
    # the de-interleaved rows keep their blocks; wk_b's rows (16 wide) are not whole blocks
    assert {"layers.0.wq_b", "layers.0.wkv_a", "layers.0.wv_b", "layers.0.wq_a"} <= set(exact)


HOSTILE_KEYS = {
    "no latent": ("deepseek2.attention.kv_lora_rank", 0, "attention.kv_lora_rank must be at least 1 for latent"),
    "latent wider than the hidden size": (
        "deepseek2.attention.kv_lora_rank",
        80,
        "deepseek2.attention.kv_lora_rank 80 is wider than the hidden size 64",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_KEYS))
def test_damaged_deepseek2_keys_are_refused_in_one_line(case, deepseek2_peer, tmp_path, capsys):
    assert_damaged_key_refused(capsys, deepseek2_peer["deepseek_v3_mla"][1]["f32"], HOSTILE_KEYS[case], tmp_path)


def test_a_key_up_projection_without_its_value_one_is_refused(deepseek2_peer, tmp_path, capsys):
    from gguf_files import raw_gguf

    raw = raw_gguf(deepseek2_peer["deepseek_v3_mla"][1]["f32"])
    raw.infos = [i for i in raw.infos if i[0] != "blk.1.attn_v_b.weight"]
    path = tmp_path / "damaged.gguf"
    path.write_bytes(raw.encode())
    line = build_refused(capsys, path, tmp_path / "out")
    assert "blk.1.attn_k_b.weight without blk.1.attn_v_b.weight" in line, line
