"""Weight image writer <-> C loader: a valid image loads; each kind of damage gets its own error."""

import subprocess

import pytest
from damaged_images import cases

from generator.compile.image import read_header
from generator.device.protocol import FrameReader
from generator.device.session import RunRequest, request_frame
from generator.errors import ColibriError

pytestmark = pytest.mark.slow  # damaged images through built firmware

PROMPT = [1, 5, 9]


def run_with_image(program, image_path):
    out = subprocess.run(
        [str(program), "--weights", str(image_path)],
        input=request_frame(RunRequest(PROMPT, 2)),
        capture_output=True,
        timeout=60,
    )
    reader = FrameReader()
    reader.feed(out.stdout)
    return out.returncode, reader.frames


@pytest.fixture(scope="module")
def built(checkpoints, builder):
    board, art, plan = builder.build(checkpoints("qwen2_bias"), "q8_0", 64)
    return art


def test_valid_image_loads(built):
    code, frames = run_with_image(built.program, built.weights)
    assert code == 0
    assert [f.kind for f in frames][-1] == "done"


def test_every_kind_of_damage_gets_its_own_error_code(built, checkpoints, builder, tmp_path):
    blob = built.weights.read_bytes()
    other = builder.build(checkpoints("qwen2_bias", seed=99), "q8_0", 64)[1].weights.read_bytes()
    f32_image = builder.build(checkpoints("qwen2_bias"), "f32", 64)[1].weights.read_bytes()
    table = cases(blob, other, f32_image)
    assert len(table) >= 30
    for name, (image, expected) in table.items():
        path = tmp_path / f"{name}.img"
        path.write_bytes(image)
        code, frames = run_with_image(built.program, path)
        errors = [f for f in frames if f.kind == "error"]
        assert code != 0 and errors, f"{name}: accepted"
        assert errors[0].int("code") == expected, f"{name}: code {errors[0].int('code')} ({errors[0].fields['msg']})"
        assert not any(f.kind == "token" for f in frames), name


def test_python_header_reader_rejects_damage(built):
    blob = built.weights.read_bytes()
    assert read_header(blob).tensor_count > 0
    with pytest.raises(ColibriError, match="bad magic"):
        read_header(b"X" + blob[1:])
    with pytest.raises(ColibriError, match="CRC"):
        read_header(blob[:200] + bytes([blob[200] ^ 1]) + blob[201:])
    with pytest.raises(ColibriError, match="says it is"):
        read_header(blob + b"\0")


def test_weight_image_is_deterministic(checkpoints, tmp_path):
    from generator.boards import load_board
    from generator.compile.pipeline import generate

    model = checkpoints("llama_gqa_linear")
    a = generate(model, load_board("host"), "q8_0", 32, tmp_path / "a")
    b = generate(model, load_board("host"), "q8_0", 32, tmp_path / "b")
    for fa, fb in zip(a.files, b.files):
        assert fa.read_bytes() == fb.read_bytes(), fa.name
