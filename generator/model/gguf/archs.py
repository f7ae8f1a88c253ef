"""GGUF architectures as data: what sets each of llama.cpp's architectures apart (GgufArch, the
GGUF side of hf/families.FAMILIES), and the architecture a file names."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import ColibriError
from .file import GgufFile


@dataclass(frozen=True)
class GgufArch:
    """What sets one GGUF architecture apart (the GGUF side of hf/families.FAMILIES)."""

    family: str  # the spec's family, as hf/families.FAMILIES names it
    architecture: str  # the Hugging Face class the spec names
    permuted_qk: bool = False  # llama.cpp's converter permuted the q/k rows (llama architecture)
    qkv_bias: bool = False  # always has q/k/v biases (Qwen2); elsewhere the tensors present decide
    qk_norm: bool = False
    gemma: bool = False  # see hf/families.Family.gemma
    moe: bool = False
    shared_expert: bool = False
    norm_topk_prob: bool = False  # llama.cpp's default when {arch}.expert_weights_norm is absent
    hybrid_linear: bool = False  # see hf/families.Family.hybrid_linear (Qwen3.5's Gated DeltaNet layers)
    # gpt-oss (llama.cpp's openai-moe): sink logits, top-k then softmax, its SwiGLU with llama.cpp's
    # fixed alpha 1.702 and limit 7.0, post_attention_norm as the FFN's input norm, sliding layers
    # alternating (llama.cpp's default pattern 2: even layers slide), and YaRN without truncation
    # (the ramp's ends not rounded; what gpt-oss's config says, and the file does not record).
    attn_sinks: bool = False
    router: str = "softmax_then_topk"
    swiglu: tuple[float, float] | None = None  # (alpha, limit) of the clamped SwiGLU
    post_attention_norm: str = "post_attn_norm"  # the canonical norm blk.N.post_attention_norm is
    swa_pattern: int = 0  # llama.cpp's default sliding-window pattern (0: every layer slides)
    yarn_truncate: bool = True
    rope_theta: float = 10000.0
    gemma4: bool = False  # see hf/families.Family.gemma4 (_gemma4 reads its keys)


GGUF_ARCHITECTURES = {
    "llama": GgufArch("llama", "LlamaForCausalLM", permuted_qk=True),
    "qwen2": GgufArch("qwen2", "Qwen2ForCausalLM", qkv_bias=True),
    "qwen3": GgufArch("qwen3", "Qwen3ForCausalLM", qk_norm=True),
    "gemma3": GgufArch("gemma3", "Gemma3ForCausalLM", qk_norm=True, gemma=True),
    "gemma4": GgufArch("gemma4", "Gemma4ForCausalLM", qk_norm=True, gemma=True, moe=True, gemma4=True),
    "qwen2moe": GgufArch("qwen2_moe", "Qwen2MoeForCausalLM", qkv_bias=True, moe=True, shared_expert=True),
    "qwen3moe": GgufArch("qwen3_moe", "Qwen3MoeForCausalLM", qk_norm=True, moe=True, norm_topk_prob=True),
    "qwen35moe": GgufArch(
        "qwen3_5_moe",
        "Qwen3_5MoeForCausalLM",
        qk_norm=True,
        moe=True,
        shared_expert=True,
        norm_topk_prob=True,
        hybrid_linear=True,
    ),
    "gpt-oss": GgufArch(
        "gpt_oss",
        "GptOssForCausalLM",
        moe=True,
        attn_sinks=True,
        router="topk_then_softmax",
        swiglu=(1.702, 7.0),
        post_attention_norm="ffn_norm",
        swa_pattern=2,
        yarn_truncate=False,
        rope_theta=150000.0,
    ),
}


# A llama-architecture file with experts is Mixtral.
LLAMA_MOE = GgufArch("mixtral", "MixtralForCausalLM", permuted_qk=True, moe=True, norm_topk_prob=True)


def arch_of(gguf: GgufFile) -> tuple[str, GgufArch]:
    supported = ", ".join(GGUF_ARCHITECTURES)
    arch = gguf.metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ColibriError(f"{gguf.path.name}: no general.architecture string in the metadata (supported: {supported})")
    if arch not in GGUF_ARCHITECTURES:
        raise ColibriError(f"{gguf.path.name}: unsupported architecture {arch!r} (supported: {supported})")
    info = GGUF_ARCHITECTURES[arch]
    if arch == "llama" and gguf.metadata.get("llama.expert_count", 0):
        info = LLAMA_MOE
    return arch, info
