"""Write a random-weight qwen3moe, deepseek2 or granitehybrid GGUF file of any size, directly as blocks (no checkpoint,
no torch): the real-scale MoE models of docs/performance.md and the > 4 GiB image of the tests.

    .venv/bin/python tools/make_moe_gguf.py OUT.gguf [--arch qwen3moe] [--layers 48] [--hidden 2048]
        [--experts 128] [--top-k 8] [--expert-ffn 768] [--heads 32] [--kv-heads 4] [--head-dim 128]
        [--vocab 49152] [--context 4096] [--expert-type Q4_0] [--attn-type Q8_0]
        [--tokenizer-from FILE.gguf] [--seed 0]
    .venv/bin/python tools/make_moe_gguf.py OUT.gguf --arch deepseek2 [--latent 512] [--rope-dim 64]
        [--nope-dim 128] [--v-dim 128] [--shared-experts 2] [--dense-layers 1] [--dense-ffn 10944] ...
    .venv/bin/python tools/make_moe_gguf.py OUT.gguf --arch granitehybrid [--attention-layers 5,15,25,35]
        [--shared-ffn 1024] [--ssm-heads 48] [--ssm-groups 1] [--ssm-state 128] [--ssm-conv 4] ...

qwen3moe's defaults are the Qwen3-30B-A3B shape (30.5 B parameters, 17.5 GB): Q4_0 experts, Q8_0
attention, embeddings and output head, F32 norms and routers, every layer a mixture of experts.
deepseek2's are DeepSeek-V2-Lite's (27 layers, hidden 2048, 16 heads with latent attention: a latent
of 512 and a shared RoPE key of 64, query heads of 128 + 64, value heads of 128, no low-rank query;
64 routed experts of 1408, top-6 by softmax, 2 shared experts; a dense first layer of 10,944; YaRN
factor 40 over 4,096 positions), the keys and tensor names llama.cpp's converter writes for it (the
newer form: attn_k_b and attn_v_b split), the shared experts and the dense layer in --attn-type.
granitehybrid's are Granite-4.0-H-Tiny's (models/configs/granite-4.0-h-tiny: 40 layers, hidden 1536;
Mamba-2 layers of 48 heads of 64 (inner 3072), one group, state 128, 4 conv taps, and attention at
layers 5, 15, 25 and 35 with 12/4 heads of 128 and no RoPE; 64 experts of 512, top-6, beside a
shared MLP of 1024; tied embeddings), the keys and tensor names llama.cpp's converter writes for it
(head_count_kv per layer, 0 on a Mamba-2 layer; ssm.*; rope.scaling.finetuned false; no output.weight)
and its Mamba-2 vectors as llama.cpp stores them (A as -exp(A_log), F32 taps); the in- and
out-projections and the shared MLP in --attn-type, the multipliers left at 1 as the config has them. The
Mamba-2 vectors are drawn as the layer is initialised: A in -16..-1, dt's bias so that softplus
gives dt log-uniform in 0.001..0.1, D and the gated norm 1, the taps' bias 0. The quants are
uniform random bytes and every block scale is drawn so that a row's values have a standard deviation
near 1/sqrt(row length), which keeps activations in range through all layers; norms are 1. The
embeddings have values of deviation 1 and the matrices that write into the residual stream
(attention output, expert down) are scaled by --branch-gain (0.1): with every matrix at the same
scale, the first layer's outputs outweigh the embedding and 48 random layers wash every token's
hidden state into one direction, so the router picks the same experts for every token (98.7 %
expert-cache hits at a quarter of the image, on any text), which no trained model does; this way the
token still shows in the last layer and routing follows the text. With
--tokenizer-from the file's `tokenizer.*` metadata is copied (SmolLM2's 49,152-token vocabulary, so
that Colibri and llama.cpp both tokenize text; --vocab must then be its size); without it the file
has no tokenizer and runs take --prompt-ids. The same arguments write the same bytes. The file is
written to OUT.gguf.partial and renamed when complete.
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from pathlib import Path

import numpy as np

ALIGNMENT = 32
CHUNK_BLOCKS = 1 << 21  # blocks generated and written at a time (36-68 MB)
# GGUF metadata value types and tensor types (ggml.h)
U32, F32_VALUE, BOOL, STRING, ARRAY = 4, 6, 7, 8, 9
TYPES = {"F32": (0, 1, 4), "Q4_0": (2, 32, 18), "Q8_0": (8, 32, 34)}  # id, values per block, bytes per block


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _kv_u32(key: str, value: int) -> bytes:
    return _string(key) + struct.pack("<II", U32, value)


def _kv_f32(key: str, value: float) -> bytes:
    return _string(key) + struct.pack("<If", F32_VALUE, value)


def _kv_str(key: str, value: str) -> bytes:
    return _string(key) + struct.pack("<I", STRING) + _string(value)


def _tokenizer_kvs(path: Path) -> tuple[list[bytes], int]:
    """The `tokenizer.*` entries of another GGUF file, byte for byte, and its vocabulary size."""
    import gguf

    reader = gguf.GGUFReader(path)
    out = [b"".join(p.tobytes() for p in f.parts) for name, f in reader.fields.items() if name.startswith("tokenizer.")]
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if not out or tokens is None:
        raise SystemExit(f"make_moe_gguf: {path} has no tokenizer metadata")
    return out, len(tokens.data)


# Per architecture: the defaults of the arguments left unset (the published shapes).
SHAPES = {
    "qwen3moe": dict(layers=48, experts=128, top_k=8, expert_ffn=768, heads=32, vocab=49152, context=4096),
    "deepseek2": dict(layers=27, experts=64, top_k=6, expert_ffn=1408, heads=16, vocab=102400, context=163840),
    "granitehybrid": dict(layers=40, hidden=1536, experts=64, top_k=6, expert_ffn=512, heads=12, vocab=100352),
}
HIDDEN = 2048  # qwen3moe's and deepseek2's width


def tensors(a) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape as rows-major dims, type) in file order: llama.cpp's names for a.arch."""
    if a.arch == "deepseek2":
        return _deepseek2_tensors(a)
    if a.arch == "granitehybrid":
        return _granitehybrid_tensors(a)
    d, q, kv = a.hidden, a.heads * a.head_dim, a.kv_heads * a.head_dim
    out = [("token_embd.weight", (a.vocab, d), a.attn_type)]
    for i in range(a.layers):
        p = f"blk.{i}."
        out += [
            (p + "attn_norm.weight", (d,), "F32"),
            (p + "attn_q.weight", (q, d), a.attn_type),
            (p + "attn_k.weight", (kv, d), a.attn_type),
            (p + "attn_v.weight", (kv, d), a.attn_type),
            (p + "attn_output.weight", (d, q), a.attn_type),
            (p + "attn_q_norm.weight", (a.head_dim,), "F32"),
            (p + "attn_k_norm.weight", (a.head_dim,), "F32"),
            (p + "ffn_norm.weight", (d,), "F32"),
            (p + "ffn_gate_inp.weight", (a.experts, d), "F32"),
            (p + "ffn_gate_exps.weight", (a.experts, a.expert_ffn, d), a.expert_type),
            (p + "ffn_up_exps.weight", (a.experts, a.expert_ffn, d), a.expert_type),
            (p + "ffn_down_exps.weight", (a.experts, d, a.expert_ffn), a.expert_type),
        ]
    out += [("output_norm.weight", (d,), "F32"), ("output.weight", (a.vocab, d), a.attn_type)]
    return out


def _deepseek2_tensors(a) -> list[tuple[str, tuple[int, ...], str]]:
    """deepseek2 as llama.cpp's converter writes DeepSeek-V2-Lite: attn_q whole (no low-rank query),
    the latent and the RoPE key in attn_kv_a_mqa, the key up-projection split off and transposed
    per head (attn_k_b), the value one per head (attn_v_b); --dense-layers leading dense layers, then
    routed experts, their router and the shared experts side by side (of --shared-experts times the
    experts' width, one matrix each)."""
    d, h, t = a.hidden, a.heads, a.attn_type
    shared = a.shared_experts * a.expert_ffn
    out = [("token_embd.weight", (a.vocab, d), t)]
    for i in range(a.layers):
        p = f"blk.{i}."
        out += [
            (p + "attn_norm.weight", (d,), "F32"),
            (p + "attn_q.weight", (h * (a.nope_dim + a.rope_dim), d), t),
            (p + "attn_kv_a_mqa.weight", (a.latent + a.rope_dim, d), t),
            (p + "attn_kv_a_norm.weight", (a.latent,), "F32"),
            (p + "attn_k_b.weight", (h, a.latent, a.nope_dim), t),
            (p + "attn_v_b.weight", (h, a.v_dim, a.latent), t),
            (p + "attn_output.weight", (d, h * a.v_dim), t),
            (p + "ffn_norm.weight", (d,), "F32"),
        ]
        if i < a.dense_layers:
            out += [
                (p + "ffn_gate.weight", (a.dense_ffn, d), t),
                (p + "ffn_up.weight", (a.dense_ffn, d), t),
                (p + "ffn_down.weight", (d, a.dense_ffn), t),
            ]
            continue
        out += [
            (p + "ffn_gate_inp.weight", (a.experts, d), "F32"),
            (p + "ffn_gate_exps.weight", (a.experts, a.expert_ffn, d), a.expert_type),
            (p + "ffn_up_exps.weight", (a.experts, a.expert_ffn, d), a.expert_type),
            (p + "ffn_down_exps.weight", (a.experts, d, a.expert_ffn), a.expert_type),
            (p + "ffn_gate_shexp.weight", (shared, d), t),
            (p + "ffn_up_shexp.weight", (shared, d), t),
            (p + "ffn_down_shexp.weight", (d, shared), t),
        ]
    out += [("output_norm.weight", (d,), "F32"), ("output.weight", (a.vocab, d), t)]
    return out


def _attention_layers(a) -> set[int]:
    return {int(i) for i in a.attention_layers.split(",") if i}


def _ssm_widths(a) -> tuple[int, int]:
    """Mamba-2's inner width (twice the hidden: the only expansion llama.cpp takes) and its
    convolution's channels (x, B and C)."""
    inner = 2 * a.hidden
    return inner, inner + 2 * a.ssm_groups * a.ssm_state


def _granitehybrid_tensors(a) -> list[tuple[str, tuple[int, ...], str]]:
    """granitehybrid as llama.cpp's converter writes Granite 4.0 H: per layer a Mamba-2 mixer (the
    in-projection to z, xBC and dt; the taps [channels, kernel] and their bias; dt's bias, A and D
    [heads, 1]; the gated norm [groups, inner / groups]; the out-projection) or, at
    --attention-layers, attention without biases; then the experts with their router and the shared
    MLP (gate, up, down) beside them; the output head tied to the embeddings."""
    d, t = a.hidden, a.attn_type
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    inner, conv = _ssm_widths(a)
    out = [("token_embd.weight", (a.vocab, d), t)]
    for i in range(a.layers):
        p = f"blk.{i}."
        out.append((p + "attn_norm.weight", (d,), "F32"))
        if i in _attention_layers(a):
            out += [
                (p + "attn_q.weight", (q, d), t),
                (p + "attn_k.weight", (kv, d), t),
                (p + "attn_v.weight", (kv, d), t),
                (p + "attn_output.weight", (d, q), t),
            ]
        else:
            out += [
                (p + "ssm_in.weight", (inner + conv + a.ssm_heads, d), t),
                (p + "ssm_conv1d.weight", (conv, a.ssm_conv), "F32"),
                (p + "ssm_conv1d.bias", (conv,), "F32"),
                (p + "ssm_dt.bias", (a.ssm_heads,), "F32"),
                (p + "ssm_a", (a.ssm_heads, 1), "F32"),
                (p + "ssm_d", (a.ssm_heads, 1), "F32"),
                (p + "ssm_norm.weight", (a.ssm_groups, inner // a.ssm_groups), "F32"),
                (p + "ssm_out.weight", (d, inner), t),
            ]
        out += [
            (p + "ffn_norm.weight", (d,), "F32"),
            (p + "ffn_gate_inp.weight", (a.experts, d), "F32"),
            (p + "ffn_gate_exps.weight", (a.experts, a.expert_ffn, d), a.expert_type),
            (p + "ffn_up_exps.weight", (a.experts, a.expert_ffn, d), a.expert_type),
            (p + "ffn_down_exps.weight", (a.experts, d, a.expert_ffn), a.expert_type),
            (p + "ffn_gate_shexp.weight", (a.shared_ffn, d), t),
            (p + "ffn_up_shexp.weight", (a.shared_ffn, d), t),
            (p + "ffn_down_shexp.weight", (d, a.shared_ffn), t),
        ]
    return out + [("output_norm.weight", (d,), "F32")]


def _kv_u32_array(key: str, values: list[int]) -> bytes:
    return _string(key) + struct.pack("<IIQ", ARRAY, U32, len(values)) + struct.pack(f"<{len(values)}I", *values)


def _kv_bool(key: str, value: bool) -> bytes:
    return _string(key) + struct.pack("<I?", BOOL, value)


def _granitehybrid_metadata(a) -> list[bytes]:
    """GraniteHybridModel's keys (conversion/granite.py), those llama.cpp's granite-hybrid.cpp reads:
    head_count_kv per layer (0 makes a layer recurrent), no RoPE and so a context of 2^20."""
    attention = _attention_layers(a)
    inner, _ = _ssm_widths(a)
    return [
        _kv_str("general.architecture", "granitehybrid"),
        _kv_u32("granitehybrid.block_count", a.layers),
        _kv_u32("granitehybrid.context_length", 1 << 20),
        _kv_u32("granitehybrid.embedding_length", a.hidden),
        _kv_u32("granitehybrid.feed_forward_length", a.expert_ffn),
        _kv_u32("granitehybrid.attention.head_count", a.heads),
        _kv_u32_array(
            "granitehybrid.attention.head_count_kv", [a.kv_heads if i in attention else 0 for i in range(a.layers)]
        ),
        _kv_f32("granitehybrid.rope.freq_base", 10000.0),
        _kv_f32("granitehybrid.attention.layer_norm_rms_epsilon", 1e-5),
        _kv_u32("granitehybrid.expert_count", a.experts),
        _kv_u32("granitehybrid.expert_used_count", a.top_k),
        _kv_u32("granitehybrid.vocab_size", a.vocab),
        _kv_u32("granitehybrid.rope.dimension_count", a.head_dim),
        _kv_u32("granitehybrid.expert_shared_feed_forward_length", a.shared_ffn),
        _kv_u32("granitehybrid.ssm.conv_kernel", a.ssm_conv),
        _kv_u32("granitehybrid.ssm.state_size", a.ssm_state),
        _kv_u32("granitehybrid.ssm.group_count", a.ssm_groups),
        _kv_u32("granitehybrid.ssm.inner_size", inner),
        _kv_u32("granitehybrid.ssm.time_step_rank", a.ssm_heads),
        _kv_bool("granitehybrid.rope.scaling.finetuned", False),
    ]


def _metadata(a) -> list[bytes]:
    """The architecture's keys, as llama.cpp's converter writes them."""
    arch = a.arch
    if arch == "granitehybrid":
        return _granitehybrid_metadata(a)
    kvs = [
        _kv_str("general.architecture", arch),
        _kv_u32(f"{arch}.block_count", a.layers),
        _kv_u32(f"{arch}.context_length", a.context),
        _kv_u32(f"{arch}.embedding_length", a.hidden),
        _kv_u32(f"{arch}.attention.head_count", a.heads),
        _kv_u32(f"{arch}.expert_count", a.experts),
        _kv_u32(f"{arch}.expert_used_count", a.top_k),
        _kv_u32(f"{arch}.expert_feed_forward_length", a.expert_ffn),
        _kv_f32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6),
    ]
    if arch == "qwen3moe":
        return kvs + [
            _kv_u32("qwen3moe.feed_forward_length", a.expert_ffn * a.top_k),
            _kv_u32("qwen3moe.attention.head_count_kv", a.kv_heads),
            _kv_u32("qwen3moe.attention.key_length", a.head_dim),
            _kv_u32("qwen3moe.attention.value_length", a.head_dim),
            _kv_f32("qwen3moe.rope.freq_base", 1000000.0),
        ]
    # deepseek2: the absorbed (one KV head) form in key/value_length, the heads' widths in *_mla;
    # V2's softmax gating (1), unscaled and not renormalised weights; YaRN as V2-Lite's config has it
    # (factor 40 over 4,096 positions, mscale_all_dim 0.707, which the converter writes times 0.1).
    return kvs + [
        _kv_u32("deepseek2.feed_forward_length", a.dense_ffn),
        _kv_u32("deepseek2.leading_dense_block_count", a.dense_layers),
        _kv_u32("deepseek2.vocab_size", a.vocab),
        _kv_u32("deepseek2.attention.head_count_kv", 1),
        _kv_u32("deepseek2.attention.kv_lora_rank", a.latent),
        _kv_u32("deepseek2.attention.key_length", a.latent + a.rope_dim),
        _kv_u32("deepseek2.attention.value_length", a.latent),
        _kv_u32("deepseek2.attention.key_length_mla", a.nope_dim + a.rope_dim),
        _kv_u32("deepseek2.attention.value_length_mla", a.v_dim),
        _kv_u32("deepseek2.expert_shared_count", a.shared_experts),
        _kv_f32("deepseek2.expert_weights_scale", 1.0),
        _kv_u32("deepseek2.expert_gating_func", 1),
        _kv_u32("deepseek2.rope.dimension_count", a.rope_dim),
        _kv_f32("deepseek2.rope.freq_base", 10000.0),
        _kv_str("deepseek2.rope.scaling.type", "yarn"),
        _kv_f32("deepseek2.rope.scaling.factor", 40.0),
        _kv_u32("deepseek2.rope.scaling.original_context_length", 4096),
        _kv_f32("deepseek2.rope.scaling.yarn_log_multiplier", 0.1 * 0.707),
    ]


# The matrices that write into the residual stream (scaled by --branch-gain).
RESIDUAL_WRITERS = (
    "attn_output.weight",
    "ffn_down_exps.weight",
    "ffn_down_shexp.weight",
    "ffn_down.weight",
    "ssm_out.weight",
)


def _mamba2_vector(rng: np.random.Generator, name: str, n: int) -> np.ndarray | None:
    """A Mamba-2 layer's vector as the layer is initialised (None: not one): A = -exp(A_log) in
    -16..-1, dt's bias the inverse softplus of a dt log-uniform in 0.001..0.1, D and the norm 1,
    the taps' bias 0."""
    if name.endswith(".ssm_a"):
        return -rng.uniform(1.0, 16.0, n).astype(np.float32)
    if name.endswith(".ssm_dt.bias"):
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(0.1), n))
        return (dt + np.log(-np.expm1(-dt))).astype(np.float32)
    if name.endswith((".ssm_d", ".ssm_norm.weight")):
        return np.ones(n, np.float32)
    if name.endswith(".ssm_conv1d.bias"):
        return np.zeros(n, np.float32)
    return None


def _nbytes(shape: tuple[int, ...], ttype: str) -> int:
    _, per_block, block_bytes = TYPES[ttype]
    n = int(np.prod(shape))
    if n % per_block:
        raise SystemExit(f"make_moe_gguf: a {ttype} tensor of shape {list(shape)} is not whole blocks of {per_block}")
    return n // per_block * block_bytes


def _write_tensor(
    f, rng: np.random.Generator, shape: tuple[int, ...], ttype: str, gain: float = 1.0, name: str = ""
) -> None:
    row = shape[-1]
    vector = _mamba2_vector(rng, name, int(np.prod(shape)))
    if vector is not None:
        f.write(vector.tobytes())
        return
    if ttype == "F32":
        if len(shape) == 1:  # a norm: ones
            f.write(np.ones(shape, np.float32).tobytes())
        else:  # a router: small normal values
            f.write((rng.standard_normal(shape, np.float32) * np.float32(row**-0.5)).tobytes())
        return
    _, per_block, block_bytes = TYPES[ttype]
    # Uniform quants have a standard deviation of 4.6 (Q4_0, -8..7) or 73 (Q8_0, -127..127): scales
    # from 0.5 to 1.5 times the one giving values of deviation 1/sqrt(row).
    centre = gain * row**-0.5 / (4.6 if ttype == "Q4_0" else 73.0)
    scales = (centre * rng.uniform(0.5, 1.5, 256)).astype(np.float16).view(np.uint8).reshape(256, 2)
    total = int(np.prod(shape)) // per_block
    for start in range(0, total, CHUNK_BLOCKS):
        n = min(CHUNK_BLOCKS, total - start)
        blocks = np.frombuffer(rng.bytes(n * block_bytes), np.uint8).reshape(n, block_bytes).copy()
        blocks[:, :2] = scales[blocks[:, 2]]  # a scale picked by the block's first quant byte
        f.write(blocks.tobytes())


def write(a, out: Path, progress=print) -> int:
    kvs = [*_metadata(a), _kv_str("general.name", out.stem), _kv_u32("general.alignment", ALIGNMENT)]
    if a.tokenizer_from:
        extra, vocab = _tokenizer_kvs(a.tokenizer_from)
        if vocab != a.vocab:
            raise SystemExit(f"make_moe_gguf: {a.tokenizer_from} has {vocab} tokens; give --vocab {vocab}")
        kvs += extra
    table = tensors(a)
    infos, offset = bytearray(), 0
    for name, shape, ttype in table:
        ne = shape[::-1]  # GGUF lists the fastest dimension first
        infos += _string(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        infos += struct.pack("<IQ", TYPES[ttype][0], offset)
        offset += -(-_nbytes(shape, ttype) // ALIGNMENT) * ALIGNMENT
    head = b"GGUF" + struct.pack("<IQQ", 3, len(table), len(kvs)) + b"".join(kvs) + bytes(infos)
    head += bytes(-len(head) % ALIGNMENT)
    total = len(head) + offset
    rng = np.random.default_rng(a.seed)
    partial = out.with_name(out.name + ".partial")
    started, written = time.monotonic(), 0
    with open(partial, "wb") as f:
        f.write(head)
        for i, (name, shape, ttype) in enumerate(table):
            gain = (
                a.branch_gain
                if name.endswith(RESIDUAL_WRITERS)
                else a.hidden**0.5
                if name == "token_embd.weight"
                else 1.0
            )
            _write_tensor(f, rng, shape, ttype, gain, name)
            n = _nbytes(shape, ttype)
            f.write(bytes(-n % ALIGNMENT))
            written += n
            if name.endswith(("ffn_down_exps.weight", "ffn_down.weight")) or i == len(table) - 1:
                progress(
                    f"make_moe_gguf: {written / 1e9:.2f} of {offset / 1e9:.2f} GB ({time.monotonic() - started:.0f} s)"
                )
    partial.rename(out)
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--arch", choices=sorted(SHAPES), default="qwen3moe")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--experts", type=int)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--expert-ffn", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--context", type=int)
    ap.add_argument("--latent", type=int, default=512, help="deepseek2: the latent's width (kv_lora_rank)")
    ap.add_argument("--rope-dim", type=int, default=64, help="deepseek2: the shared RoPE key's width")
    ap.add_argument("--nope-dim", type=int, default=128, help="deepseek2: a query head's width without RoPE")
    ap.add_argument("--v-dim", type=int, default=128, help="deepseek2: a value head's width")
    ap.add_argument("--shared-experts", type=int, default=2, help="deepseek2: shared experts of the experts' width")
    ap.add_argument("--dense-layers", type=int, default=1, help="deepseek2: leading dense layers")
    ap.add_argument("--dense-ffn", type=int, default=10944, help="deepseek2: the dense layers' width")
    ap.add_argument(
        "--attention-layers", default="5,15,25,35", help="granitehybrid: the attention layers (the rest Mamba-2)"
    )
    ap.add_argument("--shared-ffn", type=int, default=1024, help="granitehybrid: the shared MLP's width")
    ap.add_argument("--ssm-heads", type=int, default=48, help="granitehybrid: Mamba-2 heads")
    ap.add_argument("--ssm-groups", type=int, default=1, help="granitehybrid: Mamba-2 groups (of B and C)")
    ap.add_argument("--ssm-state", type=int, default=128, help="granitehybrid: Mamba-2 state size")
    ap.add_argument("--ssm-conv", type=int, default=4, help="granitehybrid: Mamba-2 convolution taps")
    ap.add_argument("--expert-type", choices=("Q4_0", "Q8_0"), default="Q4_0")
    ap.add_argument("--attn-type", choices=("Q4_0", "Q8_0"), default="Q8_0")
    ap.add_argument("--tokenizer-from", type=Path)
    ap.add_argument(
        "--branch-gain",
        type=float,
        default=0.1,
        help="scale of the matrices that write into the residual stream (attention output, expert down)",
    )
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    for key, value in SHAPES[a.arch].items():
        if getattr(a, key) is None:
            setattr(a, key, value)
    if a.hidden is None:
        a.hidden = HIDDEN
    total = write(a, a.out)
    params = sum(int(np.prod(s)) for _, s, _ in tensors(a))
    print(f"wrote {a.out}: {total:,} bytes, {params / 1e9:.2f} B parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
