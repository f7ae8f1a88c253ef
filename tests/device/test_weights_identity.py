"""The model apart from the app: a firmware carries the SHA-256 of the weight image it was built
for, checks the image in its flash at boot, and refuses any other — one clear error frame at boot
and on every request, never a decode of someone else's weights. On qemu-rv32 (the same app code as
the ESP32-P4 boards; the ESP-IDF BSP's own partition check runs against a simulated ESP-IDF in
tests/compile/test_idf_project.py)."""

from __future__ import annotations

import re

import pytest
from conftest import DEFAULT_MODEL
from damaged_images import tensor_edited

from generator.device.runner import run_on_board
from generator.device.session import RunRequest
from generator.errors import ColibriError


@pytest.mark.slow
def test_qemu_rv32_refuses_a_well_formed_image_it_was_not_built_for(builder, tmp_path):
    board, art, _ = builder.build(DEFAULT_MODEL, ctx=64, board="qemu-rv32")
    # Another image of the same model: one weight changed and its CRC-32 in the directory fixed, so
    # every structural check and every tensor's CRC pass; only the digest the app carries differs.
    forged = tmp_path / "forged.img"
    forged.write_bytes(tensor_edited(art.weights.read_bytes(), 0, 5, fix_directory=True))
    for request in (RunRequest([1, 2], 2), RunRequest([], 0, selftest=True)):
        with pytest.raises(ColibriError) as refused:
            run_on_board(board, art.program, art.weights, request, art.model_hash(), flash_image=forged)
        assert re.search(
            r"error 16: weight image is not the one this firmware was built for \(SHA-256 differs", str(refused.value)
        ), str(refused.value)
