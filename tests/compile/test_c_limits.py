"""Model values the generated C holds, range-checked against their C types before anything is
generated (C_VALUES in compile/emit.py): one line naming the config key and the limit, never gcc's
-Werror=overflow or a window that compiles as INT_MIN. None of these tests compiles."""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path

import pytest
from cli_runs import build_refused
from conftest import DEFAULT_MODEL

from generator.boards import load_board
from generator.compile import build
from generator.compile.emit import check_c_limits
from generator.errors import ColibriError


def windowed_model(tmp_path: Path, window: int) -> Path:
    """The bundled model as a Mistral checkpoint (whose config's sliding_window applies) with `window`."""
    model = tmp_path / "windowed"
    model.mkdir()
    for f in DEFAULT_MODEL.iterdir():
        if f.name != "config.json":
            (model / f.name).symlink_to(f)
    config = json.loads((DEFAULT_MODEL / "config.json").read_text())
    config.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=window)
    (model / "config.json").write_text(json.dumps(config))
    return model


@pytest.mark.parametrize("window", [2**32 + 3, 2**31])
def test_a_window_beyond_int32_is_refused_before_generating(tmp_path, capsys, window):
    line = build_refused(capsys, windowed_model(tmp_path, window), tmp_path / "out")
    assert f"sliding_window = {window}" in line and "int32_t colibri_layer_window[]" in line and "2,147,483,647" in line


def test_the_largest_int32_window_plans(tmp_path):
    _, plan = build.prepare(load_board("host"), windowed_model(tmp_path, 2**31 - 1), None, None, tmp_path / "out")
    assert set(plan.spec.layer_windows) == {2**31 - 1}


def test_a_float_beyond_float32_is_refused_naming_its_key(tmp_path):
    _, plan = build.prepare(load_board("host"), DEFAULT_MODEL, None, None, tmp_path / "out")
    check_c_limits(plan.spec, plan)
    with pytest.raises(
        ColibriError, match=r"rms_norm_eps = 1e\+39 does not fit COLIBRI_RMS_NORM_EPS .* finite float32"
    ):
        check_c_limits(replace(plan.spec, rms_norm_eps=1e39), plan)
    with pytest.raises(ColibriError, match=r"num_attention_heads = 3000000000 does not fit COLIBRI_N_HEADS"):
        check_c_limits(replace(plan.spec, n_heads=3_000_000_000), plan)


def test_a_gguf_window_of_2_to_the_62_is_refused_before_generating(tmp_path, capsys):
    """The bundled model as a GGUF file whose llama.attention.sliding_window is a UINT64 of 2^62."""
    from gguf_files import hf_to_gguf, kv, raw_gguf

    source = hf_to_gguf(DEFAULT_MODEL, tmp_path / "model.gguf")
    raw = raw_gguf(source)
    raw.kvs.append(kv("llama.attention.sliding_window", 10, struct.pack("<Q", 2**62)))  # 10: UINT64
    windowed = tmp_path / "windowed.gguf"
    windowed.write_bytes(raw.encode())
    line = build_refused(capsys, windowed, tmp_path / "out")
    assert f"sliding_window = {2**62}" in line and "int32_t colibri_layer_window[]" in line
