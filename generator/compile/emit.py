"""Emit stage: Plan + weight image identity -> model_def.h and model_data.c, through templates/.

Templates only loop and look up: every value arrives here already computed and formatted.
Strings that come from the model go through c_string/c_comment, which escape them, and the
environment is StrictUndefined, so a missing value is an error rather than an empty string.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import jinja2
import numpy as np

from .. import __version__
from ..errors import ColibriError
from ..files import REPO
from ..model.spec import ModelSpec
from ..numerics import rope
from ..numerics.blocks import FORMATS
from ..numerics.quantize import INTEGER_QUANTS, KEPT_BLOCK_TYPES, SCALE_BYTES
from . import image_format
from .arenas import KV_TILE
from .cache_plan import STORAGE_ALIGN, cache_constants, rank_shares
from .image_format import DTYPE_CODES, QUANT_CODES
from .layout import (
    ALIGN,
    GEMMA4_LAYER_MATRICES,
    align_up,
    expert_groups,
    is_matrix_part,
)
from .plan import Plan

# A Gated DeltaNet layer's fields in ColibriLayerWeights (model_def.h), and which are matrices.
LINEAR_LAYER_PARTS = (
    "lin_qkv",
    "lin_z",
    "lin_b",
    "lin_a",
    "lin_conv",
    "lin_dt_bias",
    "lin_decay_scale",
    "lin_norm",
    "lin_out",
)
# A gated short convolution layer's fields (LFM2): in_proj and out_proj (matrices), the taps.
SHORT_CONV_LAYER_PARTS = ("conv_in", "conv_taps", "conv_out")
# A Mamba-2 layer's fields (Granite 4.0 hybrid): in_proj and out_proj (matrices), the rest vectors.
MAMBA2_LAYER_PARTS = ("ssm_in", "ssm_conv", "ssm_conv_bias", "ssm_dt_bias", "ssm_a", "ssm_d", "ssm_norm", "ssm_out")

DTYPE_ORDER = sorted(DTYPE_CODES.items(), key=lambda kv: kv[1])  # (name, code), by code

TEMPLATE_DIR = REPO / "templates"
# gpt-oss's per-layer vectors: the heads' sink logits, the router's bias, every expert's biases.
GPT_OSS_LAYER_VECTORS = ("sinks", "router_bias", "expert_b_gate", "expert_b_up", "expert_b_down")
# The DeepSeek line's router: the correction bias its choice adds (V3, GLM-4.x MoE).
ROUTER_LAYER_VECTORS = ("router_choice_bias",)
GENERATED_FILES = ("model_def.h", "model_data.c", "board_def.h", "image_format.h")
# Gemma 4's per-layer parts: the per-layer input's gate and projection (matrices) and norm, the
# layer scalar, the MoE block's norms (the router's with its folded scale) and per-expert scales.
# Multi-head latent attention's per-layer parts (the matrices start with w).
LATENT_LAYER_PARTS = ("wq_a", "q_a_norm", "wq_b", "wkv_a", "kv_a_norm", "wk_b", "wv_b")
GEMMA4_LAYER_VECTORS = (
    "ple_norm",
    "layer_scalar",
    "post_dense_norm",
    "router_norm",
    "expert_scale",
    "moe_norm",
    "post_moe_norm",
)
# Phi-3.5-MoE's LayerNorm biases: per layer, and the final norm's and the output matrix's.
LAYER_NORM_BIASES = ("attn_norm_bias", "ffn_norm_bias")
GLOBAL_BIASES = ("final_norm_bias", "lm_head_bias")


def c_float(value) -> str:
    """An exact C literal for a float32 value (hexadecimal floating constant)."""
    v = float(np.float32(value))
    if v == 0.0:
        return "-0.0f" if str(v).startswith("-") else "0.0f"
    mantissa, exponent = float.hex(v).split("p")
    return mantissa.rstrip("0") + "p" + exponent + "f"


def c_string(text: str) -> str:
    """A C string literal showing `text` literally (octal escapes for anything unusual)."""
    out = []
    for byte in str(text).encode("utf-8"):
        ch = chr(byte)
        if ch in '"\\?':
            out.append("\\" + ch)
        elif 0x20 <= byte < 0x7F:
            out.append(ch)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def c_comment(text: str) -> str:
    """Text safe inside a /* */ comment: one line, printable ASCII, no comment terminator."""
    clean = "".join(ch if 0x20 <= ord(ch) < 0x7F else "?" for ch in str(text))
    return clean.replace("*/", "* /").replace("/*", "/ *")


def c_ident(text: str) -> str:
    ident = re.sub(r"[^A-Za-z0-9_]", "_", text)
    if not ident or ident[0].isdigit():
        ident = "_" + ident
    return ident


def environment(template_dir: Path = TEMPLATE_DIR) -> jinja2.Environment:
    """Jinja2 for generated files: StrictUndefined, no autoescaping (C is not HTML), the C filters."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(c_string=c_string, c_comment=c_comment, c_float=c_float, c_ident=c_ident)
    return env


def _float_rows(values: np.ndarray, per_line: int = 6) -> list[str]:
    flat = [c_float(v) for v in np.asarray(values, dtype=np.float32).reshape(-1)]
    return [", ".join(flat[i : i + per_line]) for i in range(0, len(flat), per_line)]


def _bindings(spec, by_name: dict, layer_fields: list) -> tuple[list[dict], list[dict]]:
    """ColibriWeights' fields in order, each with the tensor it points at: matrices and vectors.
    Routed experts are bound from colibri_expert_groups (runtime/weights.c), not one by one."""
    matrices, vectors = [dict(field="embed", t=by_name["embed"])], []
    if spec.ple_dim:
        matrices += [dict(field=f, t=by_name[f]) for f in ("ple_embed", "ple_model_proj")]
        vectors.append(dict(field="ple_proj_norm", t=by_name["ple_proj_norm"]))
    for i in range(spec.n_layers):
        for f in layer_fields:
            name = f"layers.{i}.{f['part']}"
            if name in by_name:
                (matrices if f["matrix"] else vectors).append(dict(field=f"layers[{i}].{f['part']}", t=by_name[name]))
        if spec.moe_layers and spec.moe_layers[i]:
            matrices.append(dict(field=f"layers[{i}].router", t=by_name[f"layers.{i}.router"]))
            if spec.shared_expert_intermediate_size:
                for part in ("w_gate", "w_up", "w_down"):
                    matrices.append(dict(field=f"layers[{i}].shared.{part}", t=by_name[f"layers.{i}.shared.{part}"]))
                if not spec.ungated_shared_expert:
                    matrices.append(dict(field=f"layers[{i}].shared_gate", t=by_name[f"layers.{i}.shared_gate"]))
    vectors.append(dict(field="final_norm", t=by_name["final_norm"]))
    matrices.append(dict(field="lm_head", t=by_name["embed" if spec.tie_embeddings else "lm_head"]))
    vectors += [dict(field=name, t=by_name[name]) for name in GLOBAL_BIASES if name in by_name]
    return matrices, vectors


def _expert_groups(plan: Plan) -> list[dict]:
    groups = []
    for g in expert_groups(plan.spec, plan.tensors):
        # Each part and group as the templates read it: its fields, and the names its C constants take.
        parts = [
            dict(asdict(p), c_part=p.part.upper(), expanded_scales_offset=align_up(p.rows * p.cols)) for p in g.parts
        ]
        groups.append(dict(asdict(g), c_name=f"LAYERS_{g.layer}", parts=parts))
    return groups


def _placements(tensors: list[dict], groups: list[dict]) -> list[tuple[dict, dict]]:
    """The data region's items in order (a named tensor, or a layer's experts as one), each with C
    expressions for where it starts and ends: consecutive pairs, for the asserts that none overlaps."""
    first = {g["first_tensor"]: g for g in groups}
    items, i = [], 0
    while i < len(tensors):
        if i in first:
            g = first[i]
            eg = f"COLIBRI_EG_{g['c_name']}"
            items.append(
                dict(
                    label=f"layers.{g['layer']}'s experts",
                    start=f"{eg}_OFFSET",
                    end=f"{eg}_OFFSET + COLIBRI_N_EXPERTS * {eg}_STRIDE",
                )
            )
            i += 3 * g["n_experts"]
            continue
        t = tensors[i]
        items.append(
            dict(
                label=t["name"],
                start=f"COLIBRI_T_{t['c_name']}_OFFSET",
                end=f"COLIBRI_T_{t['c_name']}_OFFSET + COLIBRI_T_{t['c_name']}_BYTES",
            )
        )
        i += 1
    return list(zip(items, items[1:]))


def _c_bytes(digest: bytes) -> str:
    return ", ".join(f"0x{b:02x}" for b in digest)


HELD_FIELDS = ("rows", "offset", "nbytes", "scales_offset", "mins_offset")


def _rank_tables(plan: Plan, groups: list[dict], named: list[dict], weights_sha256: bytes, rank_images) -> list[dict]:
    """colibri_rank_images: each rank image's held tensors (rank_images: compile/layout.py's
    RankImage with its identity), or, for a single board, the whole image as rank 0 of 1."""
    if not rank_images:
        held = [dict(first_row=0, **{k: t[k] for k in HELD_FIELDS}) for t in named]
        offsets = ", ".join(str(g["offset"]) for g in groups) or "0"
        return [
            dict(
                rank=0,
                named=held,
                group_offsets=offsets,
                data_bytes=plan.image.data_bytes,
                identity=_c_bytes(weights_sha256),
            )
        ]
    tables = []
    for image, identity in rank_images:
        entries = [image.tensors[t["index"]] for t in named]
        held = [
            dict(first_row=image.first_rows[t["index"]], **{k: getattr(e, k) for k in HELD_FIELDS})
            for t, e in zip(named, entries)
        ]
        offsets = ", ".join(map(str, image.group_offsets)) or "0"
        tables.append(
            dict(
                rank=image.rank,
                named=held,
                group_offsets=offsets,
                data_bytes=image.image.data_bytes,
                identity=_c_bytes(identity),
            )
        )
    return tables


def template_context(plan: Plan, model_hash: bytes, weights_sha256: bytes = bytes(32), rank_images=()) -> dict:
    spec = plan.spec
    # Each table's rows padded to the widest table's half (Gemma 4's global layers rotate wider heads).
    half = max(plan.rope_dims) // 2
    tables = [rope.tables(r, dim, plan.n_ctx) for r, dim in zip(plan.ropes, plan.rope_dims)]
    cos = np.concatenate([np.pad(c, ((0, 0), (0, half - c.shape[1])), constant_values=1.0) for c, _ in tables])
    sin = np.concatenate([np.pad(s_, ((0, 0), (0, half - s_.shape[1]))) for _, s_ in tables])
    tensors = [
        dict(
            name=t.name,
            c_name=t.c_name,
            dtype=t.dtype,
            dtype_code=DTYPE_CODES[t.dtype],
            rows=t.rows,
            cols=t.cols,
            offset=t.offset,
            nbytes=t.nbytes,
            scales_offset=t.scales_offset,
            expanded_offset=t.expanded_offset,
            expanded_scales_offset=align_up(t.rows * t.cols),
            mins_offset=t.mins_offset,
            index=i,
            is_matrix=(t.dtype != "f32" or t.rows > 1),
        )
        for i, t in enumerate(plan.tensors)
    ]
    groups = _expert_groups(plan)
    in_groups = {g["first_tensor"] + k for g in groups for k in range(3 * g["n_experts"])}
    named_tensors = [t for t in tensors if t["index"] not in in_groups]
    group_of_layer = {g["layer"]: n for n, g in enumerate(groups)}
    present = {t.name for t in plan.tensors}
    layer_fields = []
    for part in (
        "attn_norm",
        "wq",
        "wq_gate",
        "bq",
        "wk",
        "bk",
        "wv",
        "bv",
        "q_norm",
        "k_norm",
        "wo",
        "bo",
        "post_attn_norm",
        "ffn_norm",
        "w_gate",
        "b_gate",
        "w_up",
        "b_up",
        "w_down",
        "b_down",
        "post_ffn_norm",
        *LINEAR_LAYER_PARTS,
        *GPT_OSS_LAYER_VECTORS,
        *GEMMA4_LAYER_MATRICES,
        *GEMMA4_LAYER_VECTORS,
        *LATENT_LAYER_PARTS,
        *ROUTER_LAYER_VECTORS,
        *LAYER_NORM_BIASES,
        *SHORT_CONV_LAYER_PARTS,
        *MAMBA2_LAYER_PARTS,
    ):
        layer_fields.append(
            dict(
                part=part,
                matrix=is_matrix_part(part),
                present=[f"layers.{i}.{part}" in present for i in range(spec.n_layers)],
            )
        )
    matrix_bindings, vector_bindings = _bindings(spec, {t["name"]: t for t in tensors}, layer_fields)
    row_of = {t["name"]: n for n, t in enumerate(named_tensors)}
    for binding in (*matrix_bindings, *vector_bindings):
        binding["named"] = row_of[binding["t"]["name"]]
    return dict(
        fw_version=__version__,
        matrix_bindings=matrix_bindings,
        vector_bindings=vector_bindings,
        spec=spec,
        plan=plan,
        board=plan.board,
        quant=plan.quant,
        quant_code=QUANT_CODES[plan.quant],
        q8=plan.activations_q8,  # integer quants: matmul inputs quantized to q8_0
        q4_expanded=plan.expand_q4,
        scale_bytes=SCALE_BYTES,
        reads_q4_0=any(t.dtype == "q4_0" for t in plan.tensors) and not plan.expand_q4,
        reads_q4_1=any(t.dtype == "q4_1" for t in plan.tensors),
        scaled_dtypes=list(INTEGER_QUANTS),  # quants, then binary16 scales: a SCALES_OFFSET each
        kept_names=list(KEPT_BLOCK_TYPES),
        kept_types=[
            dict(
                name=name,
                ggml_type=f.ggml_type,
                block_values=f.values,
                nbytes=f.nbytes,
                used=any(t.dtype == name for t in plan.tensors),
            )
            for name, f in FORMATS.items()
        ],
        dtype_codes=DTYPE_ORDER,
        dtype_doc=", ".join(f"{code} {name}" for name, code in DTYPE_ORDER),
        quant_doc=", ".join(f"{code} {name}" for name, code in QUANT_CODES.items()),
        kept_f32=list(plan.kept_f32),
        kept_f32_bytes=plan.kept_f32_bytes,
        tensors=tensors,
        named_tensors=named_tensors,
        expert_groups=groups,
        placement_pairs=_placements(tensors, groups),
        rank_images=_rank_tables(plan, groups, named_tensors, weights_sha256, rank_images),
        layer_expert_group=", ".join(str(group_of_layer.get(i, -1)) for i in range(spec.n_layers)),
        tensor_by_name={t["name"]: t for t in tensors},
        layer_fields=layer_fields,
        scratch=[dict(asdict(b), c_name=b.name.upper()) for b in plan.scratch],
        image=plan.image,
        align=ALIGN,
        image_format=image_format,
        image_header_fields=list(image_format.HEADER.values()),
        image_entry_fields=list(image_format.DIR_ENTRY.values()),
        model_hash_hex=model_hash.hex(),
        model_hash_bytes=", ".join(f"0x{b:02x}" for b in model_hash),
        weights_sha256_hex=weights_sha256.hex(),
        weights_sha256_bytes=", ".join(f"0x{b:02x}" for b in weights_sha256),
        rms_norm_eps=c_float(spec.rms_norm_eps),
        attn_scale=c_float(spec.score_scale),
        attn_scale_doc=(
            "1: queries and keys are normalised"
            if spec.attn_scale == 1.0
            else "1 / sqrt(query_pre_attn_scalar)"
            if spec.attn_scale
            else "1 / sqrt(HEAD_DIM)"
        ),
        embed_scale=c_float(spec.embed_scale),
        final_softcap=c_float(spec.final_softcap),
        ple_scale=c_float(spec.ple_dim**0.5 if spec.ple_dim else 0.0),
        ple_proj_scale=c_float(spec.hidden_size**-0.5),
        ple_mix_scale=c_float(2.0**-0.5),
        gelu=spec.activation == "gelu_tanh",
        swiglu_clamped=spec.activation == "swiglu_clamped",
        swiglu_alpha=c_float(spec.swiglu_alpha),
        swiglu_limit=c_float(spec.swiglu_limit),
        routed_scaling=c_float(spec.routed_scaling),
        router_norm_eps=c_float(spec.router_norm_eps),
        n_rope_tables=len(plan.ropes),
        rope_doc=[
            f"table {i}: {r.scaling}, theta {r.theta:g}" + (f", factor {r.factor:g}" if r.scaling != "default" else "")
            for i, r in enumerate(plan.ropes)
        ],
        layer_rope=", ".join(str(i) for i in plan.layer_rope),
        # (a KV-sharing layer attends over its source's ring: its slots and offset)
        kv_slots=", ".join(str(plan.kv_slots[spec.kv_source(i)]) for i in range(spec.n_layers)),
        kv_offsets=", ".join(str(n) for n in plan.kv_offsets),
        kv_type_code={"f32": 0, "f16": 1, "q8_0": 2}[plan.kv_type],
        kv_ctype={"f32": "float", "f16": "uint16_t", "q8_0": "int8_t"}[plan.kv_type],
        kv_tile=KV_TILE,
        moe=spec.n_experts > 0,
        layer_moe=", ".join("1" if m else "0" for m in (spec.moe_layers or (False,) * spec.n_layers)),
        moe_layer_indices=[i for i, m in enumerate(spec.moe_layers) if m],
        rope_half=max(plan.rope_dims) // 2,
        layer_rope_half=", ".join(
            str(0 if spec.is_nope(i) else spec.layer_rotary_dim(i) // 2) for i in range(spec.n_layers)
        ),
        layer_head_dim=", ".join(str(spec.layer_head_dim(i)) for i in range(spec.n_layers)),
        layer_kv_heads=", ".join(str(spec.layer_kv_heads(i)) for i in range(spec.n_layers)),
        layer_k_eq_v=", ".join("1" if spec.layer_k_eq_v(i) else "0" for i in range(spec.n_layers)),
        layer_kv_source=", ".join(str(spec.kv_source(i)) for i in range(spec.n_layers)),
        layer_kv_split=", ".join("1" if plan.kv_split[i] else "0" for i in range(spec.n_layers)),
        kv_split_layers=sum(plan.kv_split),
        layer_ffn_dim=", ".join(str(spec.layer_ffn_dim(i)) for i in range(spec.n_layers)),
        linear=any(spec.linear_layers),
        n_linear_layers=sum(spec.linear_layers),
        layer_linear=", ".join("1" if spec.is_linear(i) else "0" for i in range(spec.n_layers)),
        linear_state_offsets=", ".join(str(o) for o in (plan.linear_state_offsets or (-1,) * spec.n_layers)),
        linear_conv_state_floats=plan.linear_conv_state_floats,
        linear_delta_state_floats=plan.linear_delta_state_floats,
        linear_state_floats=plan.linear_state_bytes // 4,
        linear_q_scale=c_float(spec.linear_k_dim**-0.5 if spec.linear_k_dim else 0.0),
        short_conv=any(spec.short_conv_layers),
        n_short_conv_layers=sum(spec.short_conv_layers),
        layer_short_conv=", ".join("1" if spec.is_short_conv(i) else "0" for i in range(spec.n_layers)),
        n_mamba_layers=sum(spec.mamba_layers),
        layer_mamba=", ".join("1" if spec.is_mamba(i) else "0" for i in range(spec.n_layers)),
        mamba_dt_min=c_float(spec.mamba_dt_min),
        mamba_dt_max=c_float(spec.mamba_dt_max),
        residual_scale=c_float(spec.residual_scale),
        logits_scaling=c_float(spec.logits_scaling),
        rope_cos_rows=_float_rows(cos),
        rope_sin_rows=_float_rows(sin),
        layer_windows=", ".join(str(w) for w in spec.layer_windows),
        eos_ids=", ".join(str(t) for t in spec.eos_token_ids) or "-1",
        n_eos=len(spec.eos_token_ids),
        layer_nope=", ".join("1" if spec.is_nope(i) else "0" for i in range(spec.n_layers)),
        layer_qk_l2_norm=", ".join(
            "1" if spec.qk_l2_norm_layers and spec.qk_l2_norm_layers[i] else "0" for i in range(spec.n_layers)
        ),
        attn_temperature_scale=c_float(spec.attn_temperature_scale),
    )


def board_context(board) -> dict:
    regions = [
        dict(
            name=r.name,
            c_name=c_ident(r.name).upper(),
            kind=r.kind,
            base=f"0x{r.base:08x}",
            size=r.size,
            holds=", ".join(r.holds),
        )
        for r in board.memory
    ]
    weights = board.region_holding("weights") if board.weights == "mapped" else None
    weights_region = next((r for r in regions if weights and r["name"] == weights.name), None)
    return dict(target=board, regions=regions, weights_region=weights_region, selftest_at_boot=int(board.selftest.boot))


def cache_context(plan: Plan, board) -> dict:
    """The expert cache's constants (compile/cache_plan.py): the firmware sizes its slots from a
    run-time budget with them, exactly as `report` and the check before a run do."""
    table = plan.paged_table
    return dict(
        cache=cache_constants(plan, board.budget_reserve),
        rank_budgets=rank_shares(plan, board.budget_reserve),  # a single board's: rank 0 of 1, the whole image
        storage_align=STORAGE_ALIGN,
        paged_table=dict(offset=table.offset if table else 0, nbytes=table.nbytes if table else 0),
    )


def render(plan: Plan, model_hash: bytes, board, weights_sha256: bytes = bytes(32), rank_images=()) -> dict[str, str]:
    env = environment()
    context = template_context(plan, model_hash, weights_sha256, rank_images)
    context.update(board_context(board))
    context.update(cache_context(plan, board))
    return {name: env.get_template(name + ".j2").render(context) for name in GENERATED_FILES}


# ---- The C types model values land in ----
#
# Every model value the generated C holds, checked against the C type it lands in, in one place,
# before anything is generated: a sliding window of 2^32 + 3 or 2^62 must be one line naming the
# config key, not gcc's -Werror=overflow in colibri_layer_window[], and 2^31 must not compile as
# INT_MIN. Counts and widths are C ints (int32_t arrays and #defines the runtime reads into int);
# byte sizes and offsets that can pass 2^31 are 64-bit in the generated C and are not listed here.
# Floats are written as float32 constants, so each must be finite there.

INT32_MAX = 2**31 - 1
FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class CValue:
    key: str  # the config key (Hugging Face's name; a GGUF file's is the same value)
    lands_in: str  # where the generated C holds it
    values: Callable[[ModelSpec, Plan], Iterable]
    ctype: str  # "int32" | "float32"


def _layers(method: str) -> Callable[[ModelSpec, Plan], Iterable]:
    return lambda s, p: (getattr(s, method)(i) for i in range(s.n_layers))


def _ropes(s: ModelSpec, p: Plan) -> Iterable:
    return [v for r in p.ropes for v in (r.theta, r.factor, r.attention_factor)]


C_VALUES = (
    CValue("vocab_size", "COLIBRI_VOCAB", lambda s, p: [s.vocab_size], "int32"),
    CValue("hidden_size", "COLIBRI_DIM", lambda s, p: [s.hidden_size], "int32"),
    CValue("intermediate_size", "COLIBRI_FFN_DIM", lambda s, p: [s.intermediate_size], "int32"),
    CValue("num_hidden_layers", "COLIBRI_N_LAYERS", lambda s, p: [s.n_layers], "int32"),
    CValue("num_attention_heads", "COLIBRI_N_HEADS", lambda s, p: [s.n_heads], "int32"),
    CValue("num_key_value_heads", "COLIBRI_N_KV_HEADS", lambda s, p: [s.n_kv_heads], "int32"),
    CValue("head_dim", "COLIBRI_HEAD_DIM", lambda s, p: [s.head_dim, s.global_head_dim], "int32"),
    CValue("num_attention_heads * head_dim", "COLIBRI_Q_DIM", lambda s, p: [s.q_dim, s.max_q_dim], "int32"),
    CValue("num_key_value_heads * head_dim", "COLIBRI_KV_DIM", lambda s, p: [s.kv_dim, s.max_kv_dim], "int32"),
    CValue("sliding_window", "int32_t colibri_layer_window[]", lambda s, p: s.layer_windows, "int32"),
    CValue("eos_token_id", "int32_t colibri_eos_ids[]", lambda s, p: s.eos_token_ids, "int32"),
    CValue("intermediate_size (per layer)", "int32_t colibri_layer_ffn_dim[]", _layers("layer_ffn_dim"), "int32"),
    CValue("num_experts", "COLIBRI_N_EXPERTS", lambda s, p: [s.n_experts], "int32"),
    CValue("num_experts_per_tok", "COLIBRI_EXPERTS_PER_TOKEN", lambda s, p: [s.experts_per_token], "int32"),
    CValue("moe_intermediate_size", "COLIBRI_EXPERT_FFN_DIM", lambda s, p: [s.expert_intermediate_size], "int32"),
    CValue(
        "shared_expert_intermediate_size",
        "COLIBRI_SHARED_FFN_DIM",
        lambda s, p: [s.shared_expert_intermediate_size],
        "int32",
    ),
    CValue(
        "n_group, topk_group", "COLIBRI_EXPERT_GROUPS*", lambda s, p: [s.expert_groups, s.expert_groups_used], "int32"
    ),
    CValue("routed_scaling_factor", "COLIBRI_ROUTED_SCALING", lambda s, p: [s.routed_scaling], "float32"),
    CValue(
        "linear attention heads and widths",
        "COLIBRI_LINEAR_*",
        lambda s, p: [s.linear_k_heads, s.linear_v_heads, s.linear_key_dim, s.linear_value_dim, s.linear_conv_dim],
        "int32",
    ),
    CValue("hidden_size_per_layer_input", "COLIBRI_PLE_DIM", lambda s, p: [s.ple_dim, s.ple_dim * s.n_layers], "int32"),
    CValue("context length (--ctx)", "COLIBRI_N_CTX", lambda s, p: [p.n_ctx], "int32"),
    CValue(
        "context length (--ctx) * key/value width", "int32_t colibri_kv_offset[]", lambda s, p: p.kv_offsets, "int32"
    ),
    CValue("rms_norm_eps", "COLIBRI_RMS_NORM_EPS", lambda s, p: [s.rms_norm_eps], "float32"),
    CValue("query_pre_attn_scalar", "COLIBRI_ATTN_SCALE", lambda s, p: [s.score_scale], "float32"),
    CValue("embedding scale", "COLIBRI_EMBED_SCALE", lambda s, p: [s.embed_scale], "float32"),
    CValue("final_logit_softcapping", "COLIBRI_FINAL_SOFTCAP", lambda s, p: [s.final_softcap], "float32"),
    CValue("swiglu_limit", "COLIBRI_SWIGLU_*", lambda s, p: [s.swiglu_alpha, s.swiglu_limit], "float32"),
    CValue("rope_theta, rope_scaling", "the RoPE tables", _ropes, "float32"),
)


def _fits(value: object, ctype: str) -> bool:
    if ctype == "int32":
        return isinstance(value, (int, np.integer)) and 0 <= value <= INT32_MAX
    return isinstance(value, (int, float, np.floating)) and math.isfinite(value) and abs(value) <= FLOAT32_MAX


_LIMITS = {
    "int32": f"an integer from 0 to {INT32_MAX:,} (int32_t)",
    "float32": f"a finite float32 (at most {FLOAT32_MAX:.4g} in magnitude)",
}


def check_c_limits(spec: ModelSpec, plan: Plan) -> None:
    """Every row of C_VALUES: the first value outside its C type is one line naming the config key,
    where the C holds it and the limit."""
    for row in C_VALUES:
        for value in row.values(spec, plan):
            if not _fits(value, row.ctype):
                raise ColibriError(
                    f"{spec.name}: {row.key} = {value!r} does not fit {row.lands_in} in the generated C: "
                    f"it must be {_LIMITS[row.ctype]}"
                )
