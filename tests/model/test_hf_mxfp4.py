"""gpt-oss as OpenAI publishes it: a safetensors checkpoint whose experts are MXFP4 blocks
(`*_blocks` codes and `*_scales` e8m0 bytes, config.json's quantization_config). The experts'
values are transformers' own dequantization of them, their blocks are the bytes llama.cpp's
converter writes for the same checkpoint, and the image keeps them exactly under the integer
quantizations (the other tensors take --quant); the firmware verifies, under an expert budget too."""

import json

import numpy as np
import pytest
from conftest import run_cli
from gguf_files import peer_convert
from safetensors.numpy import load_file, save_file

from generator.errors import ColibriError
from generator.model.load import load_model
from models import ORACLE_CONFIGS, make_checkpoint

pytestmark = pytest.mark.slow  # a converter run and three firmware builds

QUANTIZATION_CONFIG = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
}
PACKED = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def write_mxfp4_checkpoint(out, seed=7, scale_range=(121, 125), edit=None):
    """The random-init gpt-oss checkpoint (vocab 512: the converter needs kjv-tiny's tokenizer)
    with each layer's fused experts replaced by random MXFP4 blocks in the checkpoint's layout:
    [experts, out rows, in / 32, 16] codes and [experts, out rows, in / 32] e8m0 bytes."""
    config_cls, model_cls, kwargs = ORACLE_CONFIGS["gpt_oss"]
    make_checkpoint((config_cls, model_cls, dict(kwargs, vocab_size=512)), out)
    tensors = load_file(out / "model.safetensors")
    rng = np.random.default_rng(seed)
    for name in list(tensors):
        if name.endswith(PACKED):
            n, cols, rows = tensors.pop(name).shape  # saved as x @ W: [experts, in, out]
            tensors[name + "_blocks"] = rng.integers(0, 256, (n, rows, cols // 32, 16), dtype=np.uint8)
            tensors[name + "_scales"] = rng.integers(*scale_range, (n, rows, cols // 32), dtype=np.uint8)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = QUANTIZATION_CONFIG
    if edit:
        edit(tensors, config)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


@pytest.fixture(scope="module")
def mxfp4_checkpoint(tmp_path_factory):
    return write_mxfp4_checkpoint(tmp_path_factory.mktemp("gpt-oss-mxfp4") / "model")


def test_the_experts_are_transformers_own_dequantization_of_the_blocks(mxfp4_checkpoint):
    import torch
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    checkpoint = load_model(mxfp4_checkpoint)
    files = load_file(mxfp4_checkpoint / "model.safetensors")
    for layer in range(4):
        fused = {}
        for part in PACKED:
            name = f"model.layers.{layer}.{part}"
            blocks, scales = (torch.from_numpy(files[name + s]) for s in ("_blocks", "_scales"))
            fused[part] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).numpy()  # [e, in, out]
        for e in range(8):
            ours = {
                k: checkpoint.tensors[f"layers.{layer}.experts.{e}.{k}"].load() for k in ("w_gate", "w_up", "w_down")
            }
            assert np.array_equal(ours["w_gate"], fused[PACKED[0]][e][:, 0::2].T)
            assert np.array_equal(ours["w_up"], fused[PACKED[0]][e][:, 1::2].T)
            assert np.array_equal(ours["w_down"], fused[PACKED[1]][e].T)
    assert set(checkpoint.held_types.values()) == {"MXFP4"} and len(checkpoint.held_types) == 4 * 8 * 3


def test_the_experts_blocks_are_the_bytes_llama_cpps_converter_writes(mxfp4_checkpoint, tmp_path):
    import gguf

    converted = peer_convert(mxfp4_checkpoint, tmp_path / "gpt-oss-mxfp4.gguf", "f32")
    file_tensors = {t.name: t for t in gguf.GGUFReader(str(converted)).tensors}
    checkpoint = load_model(mxfp4_checkpoint)
    for layer in range(4):
        for ours, theirs in (("w_gate", "ffn_gate_exps"), ("w_up", "ffn_up_exps"), ("w_down", "ffn_down_exps")):
            t = file_tensors[f"blk.{layer}.{theirs}.weight"]
            assert t.tensor_type == gguf.GGMLQuantizationType.MXFP4
            for e in range(8):
                tensor = checkpoint.tensors[f"layers.{layer}.experts.{e}.{ours}"]
                blocks = tensor.blocks(0, tensor.shape[0]).block_bytes()
                assert np.array_equal(np.asarray(t.data)[e].reshape(-1), blocks)
    # and that file, built with its own blocks, keeps them: the same experts in the image
    done = run_cli("verify", "--board", "host", "--model", converted, "--prompt-ids", "1,5,9,200,7", "--steps", "8",
                   "--ctx", "32", "--out", tmp_path / "gguf-out")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS" in done.stdout
    plan = json.loads((tmp_path / "gguf-out" / "generated" / "plan.json").read_text())
    experts = [t for t in plan["tensors"] if ".experts." in t["name"] and ".w_" in t["name"]]
    assert {t["dtype"] for t in experts} == {"mxfp4"}


def test_q8_0_keeps_the_mxfp4_experts_and_says_so_and_verifies(mxfp4_checkpoint, tmp_path):
    done = run_cli("verify", "--board", "host", "--model", mxfp4_checkpoint, "--prompt-ids", "1,5,9,200,7",
                   "--steps", "10", "--ctx", "32", "--out", tmp_path / "out")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS" in done.stdout and "(q8_0, greedy)" in done.stdout
    assert "96 tensors kept exactly as the checkpoint holds them (96 MXFP4 as mxfp4" in done.stdout + done.stderr
    plan = json.loads((tmp_path / "out" / "generated" / "plan.json").read_text())
    dtypes = {t["name"]: t["dtype"] for t in plan["tensors"]}
    assert dtypes["layers.0.experts.0.w_gate"] == "mxfp4" and dtypes["layers.0.wq"] == "q8_0"
    assert plan["held"]["types"]["layers.3.experts.7.w_down"] == "MXFP4"
    # Their bytes in the image are the blocks: 17 per 32 values.
    entry = next(t for t in plan["tensors"] if t["name"] == "layers.0.experts.0.w_down")
    assert entry["nbytes"] == 64 * 96 // 32 * 17


def test_the_mxfp4_experts_through_the_expert_cache_give_the_same_bits(builder, mxfp4_checkpoint):
    from generator.compile.cache_plan import cache_plan
    from generator.device.runner import run_on_board
    from generator.device.session import RunRequest, cache_stats
    from generator.verify import compare, reference_run

    def run(budget: int):
        request = RunRequest([1, 5, 9, 33, 7, 12], 24, memory_budget=budget, stop_at_eos=False)
        return request, run_on_board(board, art.program, art.weights, request, art.model_hash())

    board, art, plan = builder.build(mxfp4_checkpoint, "q4_0", 64)
    assert {t.dtype for t in plan.tensors if ".experts." in t.name and ".w_" in t.name} == {"mxfp4"}
    request, unlimited = run(0)
    assert compare(unlimited, reference_run(plan, art.weights, request)).passed
    _, result = run(cache_plan(plan, board.budget_reserve, 0).constants.min_budget)
    assert cache_stats(result).cache_misses > 0
    assert result.tokens == unlimited.tokens and result.digests == unlimited.digests


def _refused(tmp_path, edit):
    model = write_mxfp4_checkpoint(tmp_path / "model", edit=edit)
    with pytest.raises(ColibriError) as e:
        checkpoint = load_model(model)
        for tensor in checkpoint.tensors.values():
            tensor.load()
    return str(e.value)


def test_a_quantization_method_it_cannot_read_is_refused_in_one_line(tmp_path):
    def gptq(tensors, config):
        config["quantization_config"] = {"quant_method": "gptq", "bits": 4}

    assert _refused(tmp_path, gptq) == (
        "config.json: quantization_config quant_method 'gptq' is not supported "
        "(give a checkpoint of plain floats, or gpt-oss's mxfp4 experts)"
    )


def test_an_e8m0_scale_of_0xff_is_refused_naming_the_tensor(tmp_path):
    def nan_scale(tensors, config):
        tensors["model.layers.2.mlp.experts.down_proj_scales"][5, 3, 1] = 0xFF

    message = _refused(tmp_path, nan_scale)
    assert "model.layers.2.mlp.experts.down_proj_scales" in message and "0xFF" in message


def test_blocks_without_their_scales_or_of_the_wrong_shape_are_refused(tmp_path):
    def no_scales(tensors, config):
        del tensors["model.layers.1.mlp.experts.gate_up_proj_scales"]

    assert "has no 'model.layers.1.mlp.experts.gate_up_proj_scales' beside it" in _refused(tmp_path / "a", no_scales)

    def short(tensors, config):
        name = "model.layers.0.mlp.experts.down_proj_blocks"
        tensors[name] = tensors[name][:, :, :2]

    message = _refused(tmp_path / "b", short)
    assert (
        "model.layers.0.mlp.experts.down_proj_blocks" in message and "config.json implies U8 [8, 64, 3, 16]" in message
    )
