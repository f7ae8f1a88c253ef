"""A build output changed outside the build (a flipped bit in the weight image, another model's
image copied over it, an edited firmware) is built again by the next build, which `build`, `run` and
`verify` all start with (tests/compile/test_build.py: an unchanged one still builds nothing)."""

import os
import time
from pathlib import Path

from damaged_images import header

from generator.boards import load_board
from generator.compile.build import prepare, run_scons
from generator.files import DEFAULT_MODEL


def changed_later(path: Path, data: bytes) -> None:
    """Write `data` over path in a later second than the build wrote it: SCons records a file's
    modification time in whole seconds, and a person's edit comes after the build anyway."""
    while int(time.time()) <= int(os.stat(path).st_mtime):
        time.sleep(0.05)
    path.write_bytes(data)


def test_an_output_changed_outside_the_build_is_built_again(tmp_path):
    """Builds the bundled model three times into one directory (generation only; the objects come
    from the build cache), so it takes several seconds."""
    request, _ = prepare(load_board("host"), DEFAULT_MODEL, None, None, tmp_path / "out")  # as ./colibri build: cached
    lines: list[str] = []
    art = run_scons(request, echo=lines.append)
    image = art.weights.read_bytes()
    firmware = art.program.read_bytes()

    flipped = bytearray(image)
    flipped[len(image) // 2] ^= 0x01  # in the tensor data: the header still names the right model
    changed_later(art.weights, bytes(flipped))
    lines.clear()
    run_scons(request, echo=lines.append)
    assert any(line.strip().startswith("GEN") for line in lines), lines
    assert art.weights.read_bytes() == image and art.program.read_bytes() == firmware

    other_model = header(image, "model_hash", bytes(range(32)))  # a valid header of another model
    changed_later(art.weights, other_model)
    changed_later(art.program, firmware[:-1] + bytes([firmware[-1] ^ 0xFF]))
    lines.clear()
    run_scons(request, echo=lines.append)
    assert any(line.strip().startswith("GEN") for line in lines), lines
    assert any(line.strip().startswith(("LINK", "CACHED")) and "firmware" in line for line in lines), lines
    assert art.weights.read_bytes() == image and art.program.read_bytes() == firmware
