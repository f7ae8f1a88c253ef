"""One door for model files: generator/model/load.py picks the format, and no stage above the
model stage names a model's files or tests for a GGUF file itself."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

from generator.files import DEFAULT_MODEL
from generator.model.gguf import is_gguf
from generator.model.load import companion_files, config_only_spec, generation_config, load_model

GENERATOR = REPO / "generator"
MODEL_FILE_NAMES = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "model.safetensors",
    "model.safetensors.index.json",
}


def literals(path: Path) -> set[str]:
    """Every string constant of a module that is a whole value (a file name joined to a path), not
    a piece of a message's f-string."""
    tree = ast.parse(path.read_text())
    in_fstrings = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in in_fstrings
    }


def test_only_the_model_stage_names_a_models_files():
    found = {
        f"{p.relative_to(GENERATOR)}: {name}"
        for p in sorted(GENERATOR.rglob("*.py"))
        if p.relative_to(GENERATOR).parts[0] != "model"
        for name in literals(p) & MODEL_FILE_NAMES
    }
    assert found == set()


def test_the_format_is_decided_in_one_place():
    found = {str(p.relative_to(GENERATOR)) for p in sorted(GENERATOR.rglob("*.py")) if ".gguf" in literals(p)}
    assert found == {"model/gguf/__init__.py"}
    assert is_gguf("a/B.GGUF") and not is_gguf("a/b.gguf.d/config.json")


def test_a_checkpoint_folder_has_no_block_types_and_travels_with_its_tokenizer():
    checkpoint = load_model(DEFAULT_MODEL, load_tensors=False)
    assert checkpoint.tensor_types is None and checkpoint.tensors == {}
    assert {p.name for p in checkpoint.input_files} == {"config.json", "generation_config.json", "model.safetensors"}
    assert [p.name for p in companion_files(DEFAULT_MODEL)] == ["tokenizer.json", "tokenizer_config.json"]
    assert config_only_spec(DEFAULT_MODEL) is None  # it has weights
    values, where = generation_config(DEFAULT_MODEL)
    assert where.name == "generation_config.json" and "eos_token_id" in values


def test_a_configuration_alone_is_planned_from_its_spec(tmp_path):
    spec = config_only_spec(DEFAULT_MODEL.parent / "configs" / "smollm2-135m")
    assert spec is not None and spec.architecture == "LlamaForCausalLM" and spec.name == "smollm2-135m"
    gguf = tmp_path / "m.gguf"
    assert config_only_spec(gguf) is None and companion_files(gguf) == [] and generation_config(gguf) == ({}, gguf)
