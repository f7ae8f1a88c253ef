"""Weight image writer <-> C loader: a valid image loads; each kind of damage gets its own error."""

import struct
import subprocess
import zlib

import pytest

from generator.errors import ColibriError
from generator.image import read_header
from generator.protocol import FrameReader

PROMPT = [1, 5, 9]


def fix_crc(blob: bytearray) -> bytes:
    struct.pack_into("<I", blob, len(blob) - 8, zlib.crc32(blob[:-8]))
    return bytes(blob)


def run_with_image(program, image_path):
    out = subprocess.run([str(program), "--weights", str(image_path), "--prompt-ids", "1,5,9", "--steps", "2"],
                         capture_output=True, timeout=60)
    reader = FrameReader()
    reader.feed(out.stdout)
    return out.returncode, reader.frames


@pytest.fixture(scope="module")
def built(checkpoints, builder):
    board, art, plan = builder.build(checkpoints("qwen2_bias"), "q8_0", 64)
    return art


def patched(blob, offset, fmt, value, crc=True):
    b = bytearray(blob)
    struct.pack_into(fmt, b, offset, value)
    return fix_crc(b) if crc else bytes(b)


def cases(blob, other_model, f32_image):
    size = len(blob)
    flipped = bytearray(blob)
    flipped[size // 2] ^= 0x10
    dir_entry = 128  # first directory entry
    return {
        "truncated_header": (blob[:100], 2),
        "truncated_body": (blob[:size // 2], 2),
        "bad_magic": (b"XOLIBRIW" + blob[8:], 3),
        "version_2": (patched(blob, 8, "<I", 2), 4),
        "header_size": (patched(blob, 12, "<I", 64), 5),
        "dir_entry_size": (patched(blob, 20, "<I", 95), 5),
        "length_field_smaller": (patched(blob, 48, "<Q", size - 64), 6),
        "trailing_bytes": (blob + bytes(64), 6),
        "flipped_data_bit": (bytes(flipped), 7),
        "flipped_bit_crc_kept": (patched(blob, size - 100, "<B", blob[size - 100] ^ 1, crc=False), 7),
        "tensor_count_zero": (patched(blob, 16, "<I", 0), 8),
        "tensor_count_max": (patched(blob, 16, "<I", 2**32 - 1), 8),
        "dir_offset_past_end": (patched(blob, 24, "<Q", size), 9),
        "dir_offset_overflow": (patched(blob, 24, "<Q", 2**64 - 8), 15),
        "data_offset_overflow": (patched(blob, 32, "<Q", 2**64 - 64), 15),
        "data_past_end": (patched(blob, 40, "<Q", size), 10),
        "data_misaligned": (patched(patched(blob, 32, "<Q", read_header(blob).data_offset + 4), 40, "<Q",
                                    read_header(blob).data_bytes - 4), 11),
        "quant_field": (patched(blob, 88, "<I", 0), 12),
        "f32_image_of_same_model": (f32_image, 12),
        "other_model": (other_model, 13),
        "model_hash_edited": (patched(blob, 56, "<B", blob[56] ^ 0xFF), 13),
        "dir_name_changed": (patched(blob, dir_entry, "<B", ord("X")), 14),
        "dir_dtype_unknown": (patched(blob, dir_entry + 64, "<I", 9), 14),
        "dir_rows_changed": (patched(blob, dir_entry + 68, "<I", 1), 14),
        "dir_offset_changed": (patched(blob, dir_entry + 80, "<Q", 64), 14),
        "dir_size_changed": (patched(blob, dir_entry + 88, "<Q", 2**63), 14),
    }


def test_valid_image_loads(built):
    code, frames = run_with_image(built.program, built.weights)
    assert code == 0
    assert [f.kind for f in frames][-1] == "done"


def test_every_kind_of_damage_gets_its_own_error_code(built, checkpoints, builder, tmp_path):
    blob = built.weights.read_bytes()
    other = builder.build(checkpoints("qwen2_bias", seed=99), "q8_0", 64)[1].weights.read_bytes()
    f32_image = builder.build(checkpoints("qwen2_bias"), "f32", 64)[1].weights.read_bytes()
    table = cases(blob, other, f32_image)
    assert len(table) >= 25
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
    from generator.pipeline import generate
    from generator.targets import load_board

    model = checkpoints("llama_gqa_linear")
    a = generate(model, load_board("host"), "q8_0", 32, tmp_path / "a")
    b = generate(model, load_board("host"), "q8_0", 32, tmp_path / "b")
    for fa, fb in zip(a.files, b.files):
        assert fa.read_bytes() == fb.read_bytes(), fa.name
