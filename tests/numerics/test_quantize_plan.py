"""q8_0 blocks and the memory planner."""

import json

import numpy as np
import pytest

from generator.compile.layout import ALIGN
from generator.compile.plan import make_plan
from generator.errors import ColibriError
from generator.model.hf.load import parse_config
from generator.numerics.quantize import dequantize_q8_0, quantize_q8_0


def test_q8_0_round_trip_error_is_within_half_a_step_per_block():
    x = np.random.default_rng(0).normal(0, 2, (16, 256)).astype(np.float32)
    qs, d = quantize_q8_0(x)
    assert qs.dtype == np.int8 and d.shape == (16, 8)
    back = dequantize_q8_0(qs, d)
    step = np.repeat(d, 32, axis=1)
    assert np.all(np.abs(back - x) <= 0.5 * step + 1e-7)
    assert np.abs(qs).max() == 127  # every block uses the full range


def test_q8_0_zero_block_has_zero_scale_and_quants():
    qs, d = quantize_q8_0(np.zeros((1, 64), np.float32))
    assert not qs.any() and not d.any()


def test_q8_0_rejects_rows_that_are_not_whole_blocks():
    with pytest.raises(ColibriError, match="multiple of 32"):
        quantize_q8_0(np.ones((2, 40), np.float32))


def spec(**over):
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 250,
        "hidden_size": 96,
        "intermediate_size": 160,
        "num_hidden_layers": 3,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
    }
    cfg.update(over)
    return parse_config(cfg, "m")


@pytest.mark.parametrize("quant", ["f32", "q8_0"])
def test_plan_places_tensors_aligned_in_order_without_overlap(quant):
    plan = make_plan(spec(), "host", quant, 100)
    prev_end = 0
    for t in plan.tensors:
        assert t.offset % ALIGN == 0 and t.offset >= prev_end
        prev_end = t.offset + t.nbytes
        if t.dtype == "q8_0":
            assert t.scales_offset % ALIGN == 0 and t.scales_offset >= t.rows * t.cols
            assert t.nbytes == t.scales_offset + t.rows * t.cols // 32 * 2  # binary16 scales
    assert prev_end <= plan.image.data_bytes
    assert plan.image.data_offset % ALIGN == 0
    assert plan.image.image_bytes == plan.image.data_offset + plan.image.data_bytes + 8
    names = [t.name for t in plan.tensors]
    assert names[0] == "embed" and names[-1] == "lm_head" and "layers.2.w_down" in names


def test_plan_scratch_and_kv_cache_sizes():
    s = spec()
    plan = make_plan(s, "host", "q8_0", 100)
    buffers = {b.name: b for b in plan.scratch}
    assert buffers["att"].count == s.n_heads * 100 and buffers["logits"].count == 250  # scores per head
    assert buffers["act_qs"].count == max(96, 2 * 48, 160)
    end = 0
    for b in plan.scratch:
        assert b.offset % ALIGN == 0 and b.offset >= end
        end = b.offset + b.nbytes
    assert plan.scratch_bytes >= end
    assert plan.kv_type == "f16" and plan.kv_bytes == 2 * s.n_layers * 100 * s.n_kv_heads * s.head_dim * 2  # binary16
    assert plan.rope_table_bytes == 2 * 100 * 24 * 4
    assert "act_qs" not in {b.name for b in make_plan(s, "host", "f32", 100).scratch}


def test_plan_json_round_trips_and_states_totals():
    plan = make_plan(spec(), "host", "q8_0", 64)
    data = json.loads(plan.to_json())
    assert data["totals"] == {
        "weights": plan.image.image_bytes,
        "kv_cache": plan.kv_bytes,
        "scratch": plan.scratch_bytes,
        "rope_tables": plan.rope_table_bytes,
        "expanded_weights": 0,
    }
    assert data["kv_cache"]["slots_per_layer"] == [64, 64, 64]
    assert (data["kv_cache"]["kv_heads"], data["kv_cache"]["head_dim"]) == (1, 48)
    assert len(data["tensors"]) == len(plan.tensors)


def test_plan_rejects_a_context_beyond_the_model():
    with pytest.raises(ColibriError, match="exceeds the model's max_position_embeddings"):
        make_plan(spec(), "host", "q8_0", 1024)


@pytest.mark.parametrize("quant", ["q8_0", "q4_0", "q4_1"])
def test_matrices_whose_rows_are_not_whole_blocks_stay_f32_and_the_rest_is_quantized(quant):
    """Intermediate 176 = 5.5 blocks: w_down's rows (176 long) stay f32; w_gate and w_up (rows of
    hidden 96) are quantized, as llama.cpp does rather than refusing the model."""
    plan = make_plan(spec(intermediate_size=176), "host", quant, 64)
    dtypes = {t.name: t.dtype for t in plan.tensors}
    assert plan.kept_f32 == tuple(f"layers.{i}.w_down" for i in range(3))
    assert all(dtypes[name] == "f32" for name in plan.kept_f32)
    assert dtypes["layers.0.w_gate"] == dtypes["layers.0.wq"] == dtypes["embed"] == quant
    down = plan.tensor("layers.0.w_down")
    assert down.nbytes == 96 * 176 * 4 and down.scales_offset == 0
    summary = plan.kept_f32_summary()
    assert summary.startswith(f"3 matrices kept in f32 ({3 * down.nbytes:,} B; rows of 176 are not whole blocks of 32)")
    assert summary.endswith("layers.*.w_down")
    assert json.loads(plan.to_json())["kept_f32"] == list(plan.kept_f32)
    assert (
        make_plan(spec(), "host", quant, 64).kept_f32 == ()
        and make_plan(spec(), "host", quant, 64).kept_f32_summary() is None
    )
