"""config.json and safetensors parsing."""

import json
import struct

import numpy as np
import pytest

from generator.errors import ColibriError
from generator.model.hf.load import parse_config, read_json
from generator.model.hf.safetensors_io import load_f32, read_header
from generator.model.load import load_model

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}


def cfg(**over):
    data = dict(BASE)
    data.update(over)
    return data


def test_legacy_and_v5_rope_formats_give_the_same_spec():
    legacy = parse_config(cfg(rope_theta=5e5, rope_scaling={"type": "linear", "factor": 4.0}), "m")
    v5 = parse_config(cfg(rope_parameters={"rope_type": "linear", "rope_theta": 5e5, "factor": 4.0}), "m")
    assert legacy.rope == v5.rope and legacy.rope.scaling == "linear" and legacy.rope.factor == 4.0
    assert parse_config(cfg(), "m").rope.theta == 10000.0


def test_unknown_rope_type_is_refused_with_the_supported_list():
    with pytest.raises(ColibriError, match="unsupported rope type 'dynamic'.*default, linear, llama3, yarn"):
        parse_config(cfg(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "m")


def test_sliding_windows_per_family():
    assert parse_config(cfg(architectures=["MistralForCausalLM"], sliding_window=16), "m").layer_windows == (16, 16)
    assert parse_config(cfg(architectures=["MistralForCausalLM"], sliding_window=None), "m").layer_windows == (0, 0)
    qwen = cfg(architectures=["Qwen2ForCausalLM"], sliding_window=32, max_window_layers=1)
    assert parse_config(qwen, "m").layer_windows == (0, 0)  # use_sliding_window defaults to false
    assert parse_config(dict(qwen, use_sliding_window=True), "m").layer_windows == (0, 32)
    typed = dict(qwen, use_sliding_window=True, layer_types=["sliding_attention", "full_attention"])
    assert parse_config(typed, "m").layer_windows == (32, 0)


def test_family_features():
    assert parse_config(cfg(architectures=["Qwen2ForCausalLM"]), "m").qkv_bias
    assert parse_config(cfg(architectures=["Qwen3ForCausalLM"], head_dim=32), "m").qk_norm
    spec = parse_config(cfg(attention_bias=True, mlp_bias=True), "m")
    assert spec.qkv_bias and spec.o_bias and spec.mlp_bias


def test_generation_config_overrides_end_of_sequence_ids():
    spec = parse_config(cfg(eos_token_id=2), "m", {"eos_token_id": [2, 7]})
    assert spec.eos_token_ids == (2, 7)


@pytest.mark.parametrize(
    "bad,message",
    [
        ({"hidden_size": True}, "must be an integer"),
        ({"hidden_size": 65}, "not divisible by num_attention_heads"),
        ({"num_key_value_heads": 3}, "not divisible by num_key_value_heads"),
        ({"vocab_size": None}, "missing required integer 'vocab_size'"),
        ({"hidden_act": "gelu"}, "unsupported hidden_act"),
        ({"architectures": ["LlamaForCausalLM", "Other"]}, "must name one architecture"),
        ({"eos_token_id": 500}, "outside the vocabulary"),
    ],
)
def test_inconsistent_configs_are_refused(bad, message):
    with pytest.raises(ColibriError, match=message):
        parse_config(cfg(**bad), "m")


def test_config_json_with_nan_or_duplicate_keys_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"a": NaN}')
    with pytest.raises(ColibriError, match="not valid JSON"):
        read_json(path)
    path.write_text('{"a": 1, "a": 2}')
    with pytest.raises(ColibriError, match="duplicate key"):
        read_json(path)


def write_safetensors(path, tensors: dict, raw_header=None, extra=b""):
    header, blobs, offset = {}, [], 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = raw_header if raw_header is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs) + extra)


def test_bfloat16_and_float16_convert_exactly(tmp_path):
    values = np.array([1.0, -2.5, 3.140625, 0.0], np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype("<u2").tobytes()
    path = tmp_path / "t.safetensors"
    write_safetensors(path, {"a": ("BF16", [4], bf16), "b": ("F16", [2, 2], values.astype("<f2").tobytes())})
    header = read_header(path)
    assert np.array_equal(load_f32(path, header["a"]), values)
    assert np.array_equal(load_f32(path, header["b"]), values.reshape(2, 2))


@pytest.mark.parametrize(
    "case,message",
    [
        ("trailing", "trailing bytes"),
        ("overlap", "overlaps"),
        ("hole", "unused bytes"),
        ("size", "do not hold shape"),
        ("dtype", "unsupported dtype"),
        ("header_len", "runs past the end"),
    ],
)
def test_broken_safetensors_are_refused(tmp_path, case, message):
    path = tmp_path / "t.safetensors"
    data = np.zeros(4, np.float32).tobytes()
    if case == "trailing":
        write_safetensors(path, {"a": ("F32", [4], data)}, extra=b"xx")
    elif case == "overlap":
        hdr = {
            "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},
        }
        write_safetensors(path, {}, raw_header=json.dumps(hdr).encode(), extra=data)
    elif case == "hole":
        hdr = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}
        write_safetensors(path, {}, raw_header=json.dumps(hdr).encode(), extra=data)
    elif case == "size":
        hdr = {"a": {"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}}
        write_safetensors(path, {}, raw_header=json.dumps(hdr).encode(), extra=data)
    elif case == "dtype":
        write_safetensors(path, {"a": ("I4", [4], data)})
    else:
        path.write_bytes(struct.pack("<Q", 10**6) + b"{}")
    with pytest.raises(ColibriError, match=message):
        read_header(path)


def test_sharded_index_may_not_point_outside_the_model_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(cfg()))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "../evil.safetensors"}}))
    with pytest.raises(ColibriError, match="outside the model directory"):
        load_model(tmp_path)
