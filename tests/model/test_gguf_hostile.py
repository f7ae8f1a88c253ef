"""Broken and hostile GGUF files through the command line, a table like the safetensors one and
llama.cpp's test-gguf.cpp: bad magic or version, truncation in every section, counts and lengths
of 2^63, unknown value and tensor types, misaligned, overlapping and out-of-file data, shapes
whose product overflows, duplicate names, an unsupported architecture. Each ends in one line,
exit status 2, no traceback and no build directory. The 2024 GGUF parser advisories (huge
counts and string lengths, overflowing shapes and offsets) are all in the table.

The tables' cases run the command in this process (`generator.cli.main`: the same parser, import
and refusal, without 0.8 s of interpreter start-up each); one case of each table runs as a user
runs it, a `python -m generator.cli` process, and must give the same line."""

import struct

import numpy as np
import pytest
from cli_runs import build_refused, cli_build_refused
from conftest import run_cli
from gguf_files import RawGguf, gguf_string, hf_to_gguf, kv, raw_gguf, set_kv, u32_kv

from generator.model.family_facts import GGUF_ARCHITECTURES
from models import make_checkpoint

U32, F32, BOOL, STRING, ARRAY = 4, 6, 7, 8, 9


@pytest.fixture(scope="session")
def good_gguf(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile-gguf")
    return hf_to_gguf(make_checkpoint("llama_gqa_linear", root / "hf"), root / "good.gguf")


def edit(fn):
    """A case that edits the file's fields and re-encodes it."""

    def apply(raw: RawGguf) -> bytes:
        fn(raw)
        return raw.encode()

    return apply


def cut(section: str, fraction: float, n_tensors: int | None = None):
    """The file cut inside `section` (the bytes before it, plus `fraction` of it); n_tensors
    overrides the header's count (0: so that the tensor count fits what is left)."""
    bounds = {
        "header": (None, "header"),
        "metadata": ("header", "metadata"),
        "tensor_infos": ("metadata", "tensor_infos"),
        "data": ("data_start", None),
    }

    def apply(raw: RawGguf) -> bytes:
        raw.n_tensors = n_tensors
        blob = raw.encode()
        first, last = bounds[section]
        start = raw.sections[first] if first else 0
        end = raw.sections[last] if last else len(blob)
        return blob[: start + int((end - start) * fraction)]

    return apply


def nested(depth: int) -> bytes:
    payload = struct.pack("<IQ", U32, 1) + struct.pack("<I", 7)
    for _ in range(depth - 1):
        payload = struct.pack("<IQ", ARRAY, 1) + payload
    return payload


def string_kv(key: str, value: str) -> bytes:
    return kv(key, STRING, gguf_string(value))


def i32_kv(key: str, value: int) -> bytes:
    return kv(key, 5, struct.pack("<i", value))


def f32_kv(key: str, value: float) -> bytes:
    return kv(key, F32, struct.pack("<f", value))


def set_value(key: str, value: float | str, encode=u32_kv):
    """A case that sets `key` to `value`, encoded as a u32 unless `encode` says otherwise."""
    return edit(lambda r: set_kv(r, key, encode(key, value)))


def tensor(raw, name):
    return next(i for i in raw.infos if i[0] == name)


def below_one(key: str, count: int):
    """A case that sets the count `key` below 1 (a negative one as an i32), and the refusal it gets."""
    return set_value(key, count, i32_kv if count < 0 else u32_kv), f"metadata '{key}' must be at least 1, got {count}"


def rename_tensor(name: str, new_name: str):
    """A case that renames the tensor `name` in the file's directory."""
    return edit(lambda r: tensor(r, name).__setitem__(0, new_name))


def reshape_tensor(name: str, shape: list[int]):
    """A case that gives the tensor `name` another shape (GGUF's order: the row's width first)."""
    return edit(lambda r: tensor(r, name).__setitem__(1, shape))


CASES = {
    "bad magic": (edit(lambda r: setattr(r, "magic", b"GGML")), "not a GGUF file (bad magic"),
    "version 1": (edit(lambda r: setattr(r, "version", 1)), "unsupported GGUF version 1 (supported: 2, 3)"),
    "version 4": (edit(lambda r: setattr(r, "version", 4)), "unsupported GGUF version 4"),
    "big-endian file": (edit(lambda r: setattr(r, "version", 3 << 24)), "big-endian GGUF files are not supported"),
    "truncated in the header": (cut("header", 0.5), "not a GGUF file (truncated header: 12 bytes)"),
    "truncated in the metadata": (cut("metadata", 0.5, n_tensors=0), "metadata"),
    "truncated in the metadata, tensor count kept": (cut("metadata", 0.5), "tensor count 21 cannot fit in the file"),
    "truncated in the tensor infos": (cut("tensor_infos", 0.5), "tensor"),
    "truncated in the data": (cut("data", 0.9), "runs past the end of the file"),
    "tensor count 2^63": (
        edit(lambda r: setattr(r, "n_tensors", 2**63)),
        "tensor count 9223372036854775808 cannot fit in the file",
    ),
    "metadata count 2^63": (
        edit(lambda r: setattr(r, "n_kv", 2**63)),
        "metadata count 9223372036854775808 cannot fit in the file",
    ),
    "metadata count 2^64 - 1": (edit(lambda r: setattr(r, "n_kv", 2**64 - 1)), "cannot fit in the file"),
    "key length past the end": (
        edit(lambda r: r.kvs.insert(0, struct.pack("<Q", 2**63) + b"general")),
        "metadata key 0: string length 9223372036854775808 runs past the end of the file",
    ),
    "string value length past the end": (
        edit(lambda r: set_kv(r, "general.name", kv("general.name", STRING, struct.pack("<Q", 2**40) + b"x"))),
        "string length 1099511627776 runs past the end",
    ),
    "key not UTF-8": (
        edit(lambda r: r.kvs.insert(0, gguf_string(b"\xff\xfe") + struct.pack("<I", U32) + bytes(4))),
        "metadata key 0 is not UTF-8",
    ),
    "unknown value type": (
        edit(lambda r: set_kv(r, "x.odd", kv("x.odd", 13, bytes(8)))),
        "metadata 'x.odd': unknown value type 13",
    ),
    "unknown array element type": (
        edit(lambda r: set_kv(r, "x.odd", kv("x.odd", ARRAY, struct.pack("<IQ", 99, 1)))),
        "unknown array element type 99",
    ),
    "array count 2^63": (
        edit(lambda r: set_kv(r, "x.big", kv("x.big", ARRAY, struct.pack("<IQ", U32, 2**63)))),
        "array of 9223372036854775808 UINT32 values runs past the end of the file",
    ),
    "string array count 2^62": (
        edit(lambda r: set_kv(r, "x.big", kv("x.big", ARRAY, struct.pack("<IQ", STRING, 2**62)))),
        "runs past the end of the file",
    ),
    "arrays nested too deep": (
        edit(lambda r: set_kv(r, "x.deep", kv("x.deep", ARRAY, nested(6)))),
        "arrays nested more than 4 deep",
    ),
    "boolean that is not 0 or 1": (
        edit(lambda r: set_kv(r, "x.flag", kv("x.flag", BOOL, b"\x05"))),
        "boolean byte 5 is neither 0 nor 1",
    ),
    "duplicate metadata key": (edit(lambda r: r.kvs.append(r.kvs[0])), "duplicate metadata key 'general.architecture'"),
    "alignment not a power of two": (
        set_value("general.alignment", 24),
        "general.alignment 24 is not a power of two",
    ),
    "unknown tensor type": (edit(lambda r: r.infos[0].__setitem__(2, 99)), "has unknown tensor type 99"),
    "removed tensor type Q4_2": (edit(lambda r: r.infos[0].__setitem__(2, 4)), "has unknown tensor type 4"),
    "5 dimensions": (
        edit(lambda r: r.infos[0].__setitem__(1, [96, 250, 1, 1, 1])),
        "has 5 dimensions (1 to 4 allowed)",
    ),
    "0 dimensions": (edit(lambda r: r.infos[0].__setitem__(1, [])), "has 0 dimensions"),
    "shape product overflows": (
        edit(lambda r: r.infos[0].__setitem__(1, [2**32, 2**32, 2**32, 2**32])),
        "runs past the end of the file",
    ),
    "dimension of 2^63": (edit(lambda r: r.infos[0].__setitem__(1, [2**63, 1])), "has a dimension of 2^63 or more"),
    "rows not whole blocks": (edit(lambda r: r.infos[0].__setitem__(2, 12)), "not whole blocks of 256"),
    "Q6_K rows not whole superblocks": (edit(lambda r: r.infos[0].__setitem__(2, 14)), "not whole blocks of 256"),
    "Q2_K rows not whole superblocks": (edit(lambda r: r.infos[0].__setitem__(2, 10)), "not whole blocks of 256"),
    "Q3_K rows not whole superblocks": (edit(lambda r: r.infos[0].__setitem__(2, 11)), "not whole blocks of 256"),
    "Q5_K rows not whole superblocks": (edit(lambda r: r.infos[0].__setitem__(2, 13)), "not whole blocks of 256"),
    "IQ4_XS rows not whole superblocks": (edit(lambda r: r.infos[0].__setitem__(2, 23)), "not whole blocks of 256"),
    "a type in ggml's table this build cannot read (Q8_1)": (
        edit(lambda r: r.infos[0].__setitem__(2, 9)),
        "tensor 'output.weight' has type Q8_1, which this build cannot read",
    ),
    "block_count 2^32 - 1": (
        set_value("llama.block_count", 2**32 - 1),
        "block_count 4294967295 but the file has tensors for 2 layers",
    ),
    "block_count one layer more than the tensors": (
        set_value("llama.block_count", 3),
        "block_count 3 but the file has tensors for 2 layers",
    ),
    "block_count negative": below_one("llama.block_count", -3),
    "Q5_0 rows not whole blocks": (
        edit(lambda r: (r.infos[0].__setitem__(2, 6), r.infos[0].__setitem__(1, [80, 250]))),
        "not whole blocks of 32",
    ),
    "misaligned data offset": (
        edit(lambda r: r.infos[-1].__setitem__(3, r.infos[-1][3] + 4)),
        "is not aligned to 32 bytes",
    ),
    "overlapping data": (edit(lambda r: r.infos[1].__setitem__(3, r.infos[0][3])), "overlaps tensor"),
    "data past the end": (
        edit(lambda r: r.infos[-1].__setitem__(3, r.infos[-1][3] + 2**20)),
        "runs past the end of the file",
    ),
    "data offset near 2^64": (edit(lambda r: r.infos[-1].__setitem__(3, 2**64 - 32)), "runs past the end of the file"),
    "duplicate tensor name": (edit(lambda r: r.infos[1].__setitem__(0, r.infos[0][0])), "duplicate tensor name"),
    "tensor name over 63 bytes": (edit(lambda r: r.infos[0].__setitem__(0, "x" * 100)), "is longer than 63 bytes"),
    "unsupported architecture": (
        set_value("general.architecture", "bert", string_kv),
        # every architecture of the family table, as the table grows
        f"unsupported architecture 'bert' (supported: {', '.join(GGUF_ARCHITECTURES)})",
    ),
    "no architecture": (edit(lambda r: set_kv(r, "general.architecture", None)), "no general.architecture string"),
    "metadata of the wrong type": (
        set_value("llama.block_count", "2", string_kv),
        "metadata 'llama.block_count' must be an integer",
    ),
    "missing tensor": (
        edit(lambda r: r.infos.remove(tensor(r, "blk.1.ffn_down.weight"))),
        "missing tensor for 'layers.1.w_down'",
    ),
    "unexpected tensor": (
        rename_tensor("blk.1.ffn_down.weight", "blk.1.ffn_odd.weight"),
        "unexpected tensor 'blk.1.ffn_odd.weight'",
    ),
    "shape differs from the metadata": (
        reshape_tensor("blk.0.attn_q.weight", [48, 192]),
        "the metadata implies [96, 96]",
    ),
    "unsupported rope scaling": (
        set_value("llama.rope.scaling.type", "longrope", string_kv),
        "unsupported rope scaling 'longrope'",
    ),
    "llama3 rope divisors of the wrong length": (
        rename_tensor("output_norm.weight", "rope_freqs.weight"),
        "tensor 'rope_freqs.weight' must hold 24 llama3 RoPE scaling divisors",
    ),
}


# gpt-oss's keys and tensors, each broken alone in the file llama.cpp's converter wrote.
GPT_OSS_CASES = {
    "yarn log multiplier": (
        set_value("gpt-oss.rope.scaling.yarn_log_multiplier", 0.1, f32_kv),
        "yarn rope with a log multiplier (mscale) is not supported",
    ),
    "yarn without its original context": (
        edit(lambda r: set_kv(r, "gpt-oss.rope.scaling.original_context_length", None)),
        "missing metadata 'gpt-oss.rope.scaling.original_context_length'",
    ),
    "yarn factor negative": (
        set_value("gpt-oss.rope.scaling.factor", -4.0, f32_kv),
        "rope scaling factor must be positive",
    ),
    "yarn beta 0": (
        set_value("gpt-oss.rope.scaling.yarn_beta_slow", 0.0, f32_kv),
        "yarn rope beta_fast and beta_slow must be positive",
    ),
    "more experts used than there are": (
        set_value("gpt-oss.expert_used_count", 9),
        "expert_used_count 9 exceeds the 8 experts",
    ),
    "sliding window pattern 0": (
        set_value("gpt-oss.attention.sliding_window_pattern", 0),
        "'gpt-oss.attention.sliding_window_pattern' must be at least 1",
    ),
    "stacked expert bias not one row per expert": (
        reshape_tensor("blk.0.ffn_up_exps.bias", [48, 16]),
        "tensor 'blk.0.ffn_up_exps.bias' has shape [16, 48], the metadata implies [768]",
    ),
    "expert count 0": below_one("gpt-oss.expert_count", 0),
    "expert count over 4096": (
        set_value("gpt-oss.expert_count", 5000),
        "expert_count 5000 exceeds 4,096",
    ),
    "sliding-window schedule of the wrong length": (
        edit(
            lambda r: set_kv(
                r,
                "gpt-oss.attention.sliding_window_pattern",
                kv("gpt-oss.attention.sliding_window_pattern", ARRAY, struct.pack("<IQ", BOOL, 3) + bytes([1, 0, 1])),
            )
        ),
        "gpt-oss.attention.sliding_window_pattern must be one boolean per layer",
    ),
    "sinks misnamed": (
        rename_tensor("blk.2.attn_sinks.weight", "blk.2.attn_sink.weight"),
        "unexpected tensor 'blk.2.attn_sink.weight'",
    ),
}


# The MoE families' metadata keys (a qwen3moe file; gpt-oss's own keys are GPT_OSS_CASES, Qwen3.5's
# QWEN35_CASES): counts of 0, negative or huge, refused when the file is imported.
MOE_CASES = {
    "expert count 0": below_one("qwen3moe.expert_count", 0),
    "expert count negative": below_one("qwen3moe.expert_count", -1),
    "expert count over 4096": (
        set_value("qwen3moe.expert_count", 4097),
        "expert_count 4097 exceeds 4,096 (the most supported)",
    ),
    "expert count 2^32 - 1": (
        set_value("qwen3moe.expert_count", 2**32 - 1),
        "expert_count 4294967295 exceeds 4,096",
    ),
    "experts used 0": below_one("qwen3moe.expert_used_count", 0),
    "block_count past the layers": (
        set_value("qwen3moe.block_count", 1 << 30),
        "block_count 1073741824 but the file has tensors for",
    ),
}


QWEN35_CASES = {
    "DeltaNet key heads 0": below_one("qwen35moe.ssm.group_count", 0),
    "DeltaNet key heads negative": below_one("qwen35moe.ssm.group_count", -2),
    "DeltaNet value heads not a multiple of the key heads": (
        set_value("qwen35moe.ssm.time_step_rank", 5),
        "ssm.time_step_rank 5 must be a multiple of ssm.group_count",
    ),
    "DeltaNet inner size 2^32 - 1": (
        set_value("qwen35moe.ssm.inner_size", 2**32 - 1),
        "and ssm.inner_size 4294967295 of it",
    ),
    "DeltaNet state size 0": below_one("qwen35moe.ssm.state_size", 0),
    "full-attention schedule 0": below_one("qwen35moe.full_attention_interval", 0),
    "full-attention schedule that disagrees with the layers": (
        set_value("qwen35moe.full_attention_interval", 2),
        "full_attention_interval 2 does not match the layers the tensors make full attention ([3])",
    ),
    "expert count over 4096": (
        set_value("qwen35moe.expert_count", 65536),
        "expert_count 65536 exceeds 4,096",
    ),
    "block_count 2^32 - 1": (
        set_value("qwen35moe.block_count", 2**32 - 1),
        "block_count 4294967295 but the file has tensors for 4 layers",
    ),
}


@pytest.fixture(scope="module")
def qwen35_file(checkpoints, tmp_path_factory):
    from gguf_files import qwen35_hf_to_gguf

    root = tmp_path_factory.mktemp("hostile-qwen35")
    return qwen35_hf_to_gguf(checkpoints("qwen3_5_moe"), root / "qwen35.gguf")


@pytest.mark.parametrize("case", sorted(QWEN35_CASES))
def test_broken_qwen35_metadata_is_refused_in_one_line(case, qwen35_file, tmp_path, capsys):
    refused_at_import(capsys, *QWEN35_CASES[case], qwen35_file, tmp_path)


@pytest.fixture(scope="module")
def moe_gguf(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile-moe")
    return hf_to_gguf(make_checkpoint("qwen3_moe", root / "hf"), root / "moe.gguf")


def refused_at_import(capsys, damage, message, good, tmp_path) -> str:
    """good's file damaged, built by the command in this process: one line naming the file."""
    path = tmp_path / "broken.gguf"
    path.write_bytes(damage(raw_gguf(good)))
    line = build_refused(capsys, path, tmp_path / "out")
    assert line.startswith("colibri: error: broken.gguf: ") and message in line, line
    return line


@pytest.mark.parametrize("case", sorted(MOE_CASES))
def test_broken_moe_metadata_is_refused_in_one_line(case, moe_gguf, tmp_path, capsys):
    refused_at_import(capsys, *MOE_CASES[case], moe_gguf, tmp_path)


@pytest.mark.parametrize("case", sorted(CASES))
def test_broken_gguf_is_refused_in_one_line(case, good_gguf, tmp_path, capsys):
    refused_at_import(capsys, *CASES[case], good_gguf, tmp_path)


@pytest.mark.parametrize(
    "table, case, file",
    [
        (CASES, "bad magic", "good_gguf"),
        (MOE_CASES, "expert count 2^32 - 1", "moe_gguf"),
        (QWEN35_CASES, "block_count 2^32 - 1", "qwen35_file"),
    ],
    ids=["llama", "moe", "qwen35"],
)
def test_a_tables_case_through_the_command_line_is_the_same_line(table, case, file, request, tmp_path, capsys):
    """The command as a user runs it, in a process of its own: exit status 2, no traceback, no
    build directory, and the line the in-process run gave."""
    good = request.getfixturevalue(file)
    in_process = refused_at_import(capsys, *table[case], good, tmp_path)
    assert cli_build_refused(tmp_path / "broken.gguf", tmp_path / "out") == in_process


@pytest.mark.slow  # llama.cpp's converter writes the file (~10 s), each broken copy built
@pytest.mark.parametrize("case", sorted(GPT_OSS_CASES))
def test_broken_gpt_oss_gguf_is_refused_in_one_line(case, gpt_oss_peer, tmp_path, capsys):
    refused_at_import(capsys, *GPT_OSS_CASES[case], gpt_oss_peer[1]["f32"], tmp_path)


@pytest.mark.slow
@pytest.mark.slow
@pytest.mark.slow
def test_nan_in_the_weights_is_refused_without_output(good_gguf, tmp_path):
    raw = raw_gguf(good_gguf)
    offset = tensor(raw, "output_norm.weight")[3]
    raw.data = raw.data[:offset] + np.float32(np.nan).tobytes() + raw.data[offset + 4 :]
    path = tmp_path / "nan.gguf"
    path.write_bytes(raw.encode())
    done = run_cli("build", "--model", path, "--out", tmp_path / "out")
    assert done.returncode == 2, done.stderr
    assert "colibri: error: nan.gguf: tensor 'output_norm.weight' contains NaN or Inf" in done.stderr
    assert not (tmp_path / "out").exists(), "a rejected model left its build directory behind"


def test_the_re_encoded_file_is_the_good_file(good_gguf):
    """The table's damage is the only difference: re-encoding the fields gives the file back."""
    assert raw_gguf(good_gguf).encode() == good_gguf.read_bytes()


@pytest.mark.slow
@pytest.mark.slow
@pytest.mark.slow
def test_an_empty_file_and_a_directory_are_refused(tmp_path):
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    done = run_cli("build", "--model", empty, "--out", tmp_path / "out")
    assert done.returncode == 2 and "empty.gguf: not a GGUF file (truncated header: 0 bytes)" in done.stderr
    missing = run_cli("build", "--model", tmp_path / "missing.gguf", "--out", tmp_path / "out")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert not (tmp_path / "out").exists()


def test_a_version_2_file_reads_as_version_3(good_gguf, tmp_path):
    from generator.model.gguf.load import load_gguf

    raw = raw_gguf(good_gguf)
    raw.version = 2
    path = tmp_path / "v2.gguf"
    path.write_bytes(raw.encode())
    v2, v3 = load_gguf(path), load_gguf(good_gguf)
    assert v2.gguf.version == 2 and v2.spec == v3.spec.__class__(**{**v3.spec.__dict__, "name": "v2"})
    assert all(np.array_equal(v2.tensors[n].load(), v3.tensors[n].load()) for n in v3.tensors)


@pytest.fixture(scope="module")
def k_gguf(tmp_path_factory):
    """A file whose matrices are Q4_K blocks (rows of 256 and 512 values: whole superblocks)."""
    from models import ORACLE_CONFIGS

    base = ORACLE_CONFIGS["llama_gqa_linear"]
    config = (base[0], base[1], dict(base[2], hidden_size=256, intermediate_size=512, num_attention_heads=4))
    root = tmp_path_factory.mktemp("hostile-k")
    return hf_to_gguf(make_checkpoint(config, root / "hf"), root / "k.gguf", "Q4_K")


def refused(path, out, message):
    """One error line (after the build's progress, when the blocks are read), exit status 2, no output."""
    done = run_cli("build", "--model", path, "--quant", "gguf", "--ctx", "64", "--out", out)
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert done.returncode == 2 and len(errors) == 1, done.stderr
    assert errors[0].startswith(f"colibri: error: {path.name}: ") and message in errors[0], errors[0]
    assert "Traceback" not in done.stderr and not out.exists(), "a rejected model left its build directory behind"


@pytest.mark.parametrize("field, value", [("d", np.inf), ("dmin", -np.inf), ("d", np.nan), ("dmin", np.nan)])
def test_a_k_block_with_an_infinite_or_nan_scale_is_refused_naming_the_tensor(k_gguf, tmp_path, field, value):
    raw = raw_gguf(k_gguf)
    offset = tensor(raw, "blk.1.ffn_up.weight")[3] + 144 * 5 + (0 if field == "d" else 2)  # the 6th superblock
    raw.data = raw.data[:offset] + np.array([value], "<f2").tobytes() + raw.data[offset + 2 :]
    path = tmp_path / "bad-scale.gguf"
    path.write_bytes(raw.encode())
    refused(
        path,
        tmp_path / "out",
        "tensor 'blk.1.ffn_up.weight' (Q4_K): a block's binary16 scale or minimum is infinite or NaN",
    )


@pytest.fixture(scope="module")
def mxfp4_gguf(good_gguf):
    """The good file's checkpoint with MXFP4 matrices (17-byte blocks: the e8m0 exponent, then 16
    nibble bytes)."""
    return hf_to_gguf(good_gguf.parent / "hf", good_gguf.parent / "mxfp4.gguf", "MXFP4")


@pytest.mark.parametrize(
    "exponent, nibbles",
    [(0xFF, 0x21), (0xFE, 0x14), (157, 0x17)],  # every exponent and nibble: test_gguf_blocks.py
    ids=["nan-scale-small-values", "4-times-2^126", "12-times-2^29-past-the-weight-limit"],
)
def test_an_mxfp4_block_that_cannot_hold_finite_values_is_refused_naming_the_tensor(
    mxfp4_gguf, tmp_path, exponent, nibbles
):
    """e = 0xFF is NaN in the OCP MX spec (ggml's decoding would read 2^127 and go on); 0xFE and 0xFD
    with a value of 4 or 8 make an infinite weight; 157 with a value of 12 a finite one of 6.4e9,
    past the +-2^32 a weight may be (docs/numerics.md, "Non-finite values")."""
    raw = raw_gguf(mxfp4_gguf)
    offset = tensor(raw, "blk.1.ffn_up.weight")[3] + 17 * 7  # the 8th block
    block = bytes([exponent]) + bytes([0x00] * 15) + bytes([nibbles])
    raw.data = raw.data[:offset] + block + raw.data[offset + 17 :]
    path = tmp_path / "bad-exponent.gguf"
    path.write_bytes(raw.encode())
    refused(
        path,
        tmp_path / "out",
        "tensor 'blk.1.ffn_up.weight' (MXFP4): a block's e8m0 scale is 0xFF (NaN) or makes one of its values "
        "overflow float32",
    )


@pytest.mark.slow  # a whole build (~10 s)
def test_an_mxfp4_block_at_the_largest_values_a_weight_may_be_is_kept(mxfp4_gguf, tmp_path):
    """156 with values up to 12 (3.2e9) and 157 with values up to 8 (2^32 exactly) are within the
    +-2^32 a weight may be: kept."""
    raw = raw_gguf(mxfp4_gguf)
    offset = tensor(raw, "blk.1.ffn_up.weight")[3] + 17 * 7
    block = bytes([156]) + bytes([0x7F] * 16) + bytes([157]) + bytes([0x6E] * 16)  # 12, -12; 8, -8
    raw.data = raw.data[:offset] + block + raw.data[offset + 34 :]
    path = tmp_path / "top-exponent.gguf"
    path.write_bytes(raw.encode())
    done = run_cli("build", "--model", path, "--quant", "gguf", "--ctx", "64", "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr


def test_a_file_cut_inside_a_superblock_is_refused_naming_the_tensor(k_gguf, tmp_path):
    raw = raw_gguf(k_gguf)
    moved = tensor(raw, "blk.0.attn_v.weight")  # its data moved to the end of the file, then cut short
    assert moved[2] == 12
    nbytes = moved[1][0] // 256 * 144 * moved[1][1]
    start = -len(raw.data) % 32 + len(raw.data)
    raw.data = raw.data + bytes(start - len(raw.data)) + raw.data[moved[3] : moved[3] + nbytes]
    moved[3] = start
    blob = raw.encode()
    cut_at = raw.sections["data_start"] + start + 144 * 3 + 50  # inside its fourth superblock
    path = tmp_path / "cut.gguf"
    path.write_bytes(blob[:cut_at])
    refused(path, tmp_path / "out", "tensor 'blk.0.attn_v.weight'")


# ---- every kept block type's scales -----------------------------------------------------------


class _Blocks:
    """What the image builder reads of a tensor's kept blocks: their bytes."""

    def __init__(self, raw: np.ndarray):
        self.raw = raw

    def block_bytes(self) -> np.ndarray:
        return self.raw


def kept_blocks(dtype: str, n: int = 4, seed: int = 0) -> np.ndarray:
    """n random blocks of a kept type, every binary16 field a finite 0.01 (MXFP4: exponent 120)."""
    from generator.numerics.blocks import FORMATS

    fmt = FORMATS[dtype]
    raw = np.random.default_rng(seed).integers(0, 256, (n, fmt.nbytes), dtype=np.uint8)
    for at in fmt.halves:
        raw[:, at : at + 2] = np.array([np.float16(0.01)]).view(np.uint8)
    if dtype == "mxfp4":
        raw[:, 0] = 120
    return raw


HALF_TYPES = ["q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "q3_k", "q2_k", "iq4_nl", "iq4_xs"]


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("dtype", HALF_TYPES)
def test_every_kept_types_non_finite_scale_is_refused_naming_the_tensor(dtype, value):
    """Each binary16 field (d, dmin, m) of the third block, in turn."""
    from generator.compile.image import encode_blocks
    from generator.errors import ColibriError
    from generator.numerics.blocks import FORMATS

    for at in FORMATS[dtype].halves:
        raw = kept_blocks(dtype)
        raw[2, at : at + 2] = np.array([np.float16(value)]).view(np.uint8)
        with pytest.raises(ColibriError, match=rf"tensor 'w' \({FORMATS[dtype].ggml_type}\): a block's binary16"):
            encode_blocks(_Blocks(raw), dtype, "tensor 'w'")


@pytest.mark.parametrize("dtype", [*HALF_TYPES, "mxfp4"])
def test_every_kept_types_subnormal_scale_is_kept_and_decodes_as_ggml_decodes_it(dtype):
    """Subnormal binary16 scales (0x0001, 0x03FF) and MXFP4's subnormal exponents 0 and 1 are legal:
    kept verbatim, and the reference decodes them bit for bit as the gguf package does."""
    import gguf

    from generator.compile.image import encode_blocks
    from generator.numerics.blocks import FORMATS, dequantize

    fmt = FORMATS[dtype]
    raw = kept_blocks(dtype)
    for k, bits in enumerate([0x0001, 0x03FF, 0x8001, 0x0200]):
        for at in fmt.halves:
            raw[k, at : at + 2] = np.array([bits], "<u2").view(np.uint8)
        if dtype == "mxfp4":
            raw[k, 0] = k % 2
    kept, _, _ = encode_blocks(_Blocks(raw), dtype, "tensor 'w'")
    assert np.array_equal(kept, raw)
    ours = dequantize(dtype, raw).reshape(-1)
    theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[fmt.ggml_type]).reshape(-1)
    assert (
        np.all(np.isfinite(ours))
        and ours.view(np.uint32).tolist() == theirs.astype(np.float32).view(np.uint32).tolist()
    )
