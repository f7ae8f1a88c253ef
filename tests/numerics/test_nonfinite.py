"""A NaN or an infinity is an error, never a token or a PASS: weights whose products overflow
float32 are refused at import by name, a vocabulary shorter than the model's rows is refused, and
a value that still overflows at run time stops the firmware and the reference at the same step,
naming the first layer whose output was not finite (docs/numerics.md, "Non-finite values")."""

import json
import shutil
from pathlib import Path

import gguf
import pytest
from conftest import run_cli
from safetensors.numpy import load_file, save_file

from generator.compile.image import map_image
from generator.device.protocol import encode_frame, parse_frame
from generator.device.runner import run_on_board
from generator.device.session import RunRequest, Session
from generator.errors import ColibriError, NonFiniteLogits
from generator.model.load import load_model
from generator.numerics.sampling import SamplingParams
from generator.reference import Reference

KJV_TINY = Path(__file__).resolve().parents[2] / "models" / "kjv-tiny"
# The token whose embedding alone takes the first layer's FFN past float32 (overflowing_model).
OVERFLOW_TOKEN = 5


def edited_copy(source, out, edit):
    """A copy of the checkpoint at `source` whose tensors `edit` changes in place."""
    shutil.copytree(source, out)
    tensors = load_file(out / "model.safetensors")
    edit(tensors)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


def overflow_at_token(t):
    """Only OVERFLOW_TOKEN's embedding has a component along hidden dimension 0, and nothing else
    writes one before the first FFN (o_proj's row 0 is zero); that dimension's FFN norm weight and
    gate/up columns are 4e9, inside the import limit (2^32): for that token gate and up are about
    1e20 each and their product overflows, for every other token the dimension is exactly 0. Its
    output row is zero, so greedy decoding never picks it: the self-test's golden decode stays finite."""
    embed = t["model.embed_tokens.weight"]
    embed[:, 0] = 0
    embed[OVERFLOW_TOKEN] = 0
    embed[OVERFLOW_TOKEN, 0] = 1
    t["model.layers.0.self_attn.o_proj.weight"][0] = 0
    t["model.layers.0.post_attention_layernorm.weight"][0] = 4e9
    t["model.layers.0.mlp.gate_proj.weight"][:, 0] = 4e9
    t["model.layers.0.mlp.up_proj.weight"][:, 0] = 4e9
    t["lm_head.weight"][OVERFLOW_TOKEN] = 0


@pytest.fixture(scope="module")
def overflowing_model(checkpoints, tmp_path_factory):
    return edited_copy(checkpoints("mistral_window"), tmp_path_factory.mktemp("overflow") / "model", overflow_at_token)


@pytest.fixture(scope="module")
def overflowing_build(builder, overflowing_model):
    """The host firmware of overflowing_model, f32 weights and KV cache (q8_0 cannot hold a
    column of 4e9 beside weights of 0.1 in one block)."""
    return builder.build(overflowing_model, "f32")


def board_run(overflowing_build, request):
    board, art, _ = overflowing_build
    return run_on_board(board, art.program, art.weights, request, art.model_hash())


def test_the_firmware_stops_at_the_step_whose_logits_overflow_naming_the_first_layer(overflowing_build):
    prompt = [1, 2, 3, OVERFLOW_TOKEN, 7]
    with pytest.raises(NonFiniteLogits) as stopped:
        board_run(overflowing_build, RunRequest(prompt, 4, decode_from=2))
    assert (stopped.value.side, stopped.value.at, stopped.value.layer) == ("the firmware", "step 2", 0)
    assert "step 2" in str(stopped.value) and "layer 0" in str(stopped.value) and "\n" not in str(stopped.value)
    finite = board_run(overflowing_build, RunRequest([1, 2, 3], 4, stop_at_eos=False))
    assert len(finite.tokens) == 4 and OVERFLOW_TOKEN not in finite.tokens


def test_the_reference_stops_at_the_same_step_and_layer(overflowing_build):
    _, art, plan = overflowing_build
    reference = Reference(plan, map_image(art.weights))
    with pytest.raises(NonFiniteLogits) as stopped:
        reference.generate([1, 2, 3, OVERFLOW_TOKEN, 7], 4, SamplingParams(), decode_from=2)
    assert (stopped.value.side, stopped.value.at, stopped.value.layer) == ("the reference", "step 2", 0)


def test_a_scored_prompt_stops_at_the_token_scored_from_overflowing_logits(overflowing_build):
    """eval's path: score frames carry the flag as token frames do."""
    _, art, plan = overflowing_build
    prompt = [1, 2, OVERFLOW_TOKEN, 3]
    with pytest.raises(NonFiniteLogits) as on_board:
        board_run(overflowing_build, RunRequest(prompt, 0, score_from=0))
    with pytest.raises(NonFiniteLogits) as in_reference:
        Reference(plan, map_image(art.weights)).generate(prompt, 0, SamplingParams(), score_from=0)
    assert on_board.value.at == in_reference.value.at == "prompt token 3"
    assert on_board.value.layer == in_reference.value.layer == 0


def test_verify_never_says_pass_over_a_nan(overflowing_model, overflowing_build, builder):
    """Before, NaN logits on both sides hashed alike and verify printed PASS."""
    out = builder.root / f"{overflowing_model.name}-f32-64-host-kvf32"  # the build overflowing_build made
    done = run_cli(
        "verify", "--model", overflowing_model, "--quant", "f32", "--ctx", 64, "--kv-type", "f32",
        "--out", out, "--prompt-ids", f"1,{OVERFLOW_TOKEN},3", "--steps", 3,
    )  # fmt: skip
    assert done.returncode == 2 and "PASS" not in done.stdout
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("colibri: error: the firmware's logits at step 0") and "layer 0" in error


@pytest.mark.parametrize(
    "flag, layer", [("0", 0), ("3", 3), ("head", None)], ids=["first layer", "a later layer", "output head"]
)
def test_a_token_frame_with_the_flag_ends_the_run_naming_its_layer(flag, layer):
    session = Session()
    with pytest.raises(NonFiniteLogits) as stopped:
        session.handle(parse_frame(encode_frame(0, "token", {"step": 0, "id": 0, "us": 1, "nonfinite": flag})))
    assert stopped.value.layer == layer and not session.result.tokens
    if layer is None:
        assert "final norm or the output matrix" in str(stopped.value)


def test_a_malformed_flag_is_a_malformed_frame():
    with pytest.raises(ColibriError, match="malformed token frame"):
        Session().handle(parse_frame(encode_frame(0, "token", {"step": 0, "id": 0, "nonfinite": "x1"})))


# ---- refused at import -----------------------------------------------------------------------


def set_to(name, value):
    def edit(t):
        t[name][...] = value

    return edit


@pytest.mark.parametrize(
    "tensor",
    ["model.layers.1.self_attn.q_proj.weight", "model.layers.0.input_layernorm.weight"],
    ids=["q_proj (run with f32)", "a norm (run with q8_0)"],
)
def test_a_weight_of_3e38_is_refused_at_import_by_name(checkpoints, tmp_path, tensor):
    """Before, 3e38 was finite and imported: every logit NaN (q_proj, f32: verify said PASS) or
    garbage (the norm, q8_0: run exited 0). Every tensor is read as generation reads it."""
    model = edited_copy(checkpoints("mistral_window"), tmp_path / "model", set_to(tensor, 3e38))
    with pytest.raises(ColibriError) as refused:
        for weights in load_model(model).tensors.values():
            weights.load()
    assert str(refused.value) == (
        f"model.safetensors: tensor '{tensor}' holds a weight of 3e+38, beyond the +-2^32 (4.29e+09) a weight "
        f'may be: its products overflow float32 (docs/numerics.md, "Non-finite values")'
    )


def test_a_gguf_vocabulary_shorter_than_the_model_is_refused_at_import(checkpoints, tmp_path):
    """Before, 300 tokens for 512 rows imported, and ids past 299 vanished from the text."""
    from gguf_files import hf_to_gguf

    model = checkpoints("llama_gqa_linear")
    rows = json.loads((model / "config.json").read_text())["vocab_size"]
    tokens = [f"t{i}" for i in range(rows - 50)]
    keys = {
        "tokenizer.ggml.model": ("gpt2", gguf.GGUFValueType.STRING),
        "tokenizer.ggml.tokens": (tokens, gguf.GGUFValueType.ARRAY),
    }
    path = hf_to_gguf(model, tmp_path / "short.gguf", tokenizer=keys)
    with pytest.raises(ColibriError) as refused:
        load_model(path)
    assert str(refused.value) == (
        f"short.gguf: the vocabulary (tokenizer.ggml.tokens) has {rows - 50} tokens but the model "
        f"has {rows} rows: ids {rows - 50}..{rows - 1} would have no text (give the file its full vocabulary)"
    )


def test_a_tokenizer_json_shorter_than_the_model_beyond_padding_is_refused():
    """kjv-tiny's tokenizer (512 ids) beside a model of 200 rows is fine; beside one of 600 rows
    it leaves 88 rows (15 %) without text: refused before building. Qwen2.5's 0.18 % of padding
    rows passes."""
    from generator.model.tokenizer import Tokenizer

    tokenizer = Tokenizer.for_model(KJV_TINY)
    tokenizer.check_covers(200, KJV_TINY)
    tokenizer.check_covers(151_936 * 512 // 151_665, KJV_TINY)  # Qwen2.5's share of padding rows
    with pytest.raises(ColibriError, match=r"tokenizer.json has 512 tokens but the model has 600 output rows"):
        tokenizer.check_covers(600, KJV_TINY)
