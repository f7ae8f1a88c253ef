"""A board file that extends another (boards/load.py): what it takes, what merges, what
replaces, what it drops, and the one-line refusals."""

from __future__ import annotations

import pytest

from generator.boards import board_files, load_board
from generator.boards import load as load_module
from generator.errors import ColibriError


def test_the_boards_that_extend_esp32p4_take_its_chip_compiler_and_self_test():
    p4, idf, rv32 = load_board("esp32p4"), load_board("esp32p4-idf"), load_board("qemu-rv32")
    for board in (idf, rv32):
        assert (board.isa, board.kernels, board.parallel, board.cc, board.libs, board.selftest) == (
            p4.isa,
            p4.kernels,
            p4.parallel,
            p4.cc,
            p4.libs,
            p4.selftest,
        )
        assert board_files(board) == (board.path, p4.path)
    assert (rv32.cflags, rv32.ldflags, rv32.program) == (p4.cflags, p4.ldflags, p4.program)
    assert idf.flash is not None and p4.flash is not None
    assert (idf.flash.chip, idf.flash.chip_id, idf.flash.mode, idf.flash.frequency) == (
        p4.flash.chip,
        p4.flash.chip_id,
        p4.flash.mode,
        p4.flash.frequency,
    )
    assert idf.runner.kind == p4.runner.kind == "serial" and idf.weights == "partition"
    # what they unset: the ROM-loaded image's linker script, window and files; qemu-rv32's flash
    assert idf.linker_script is None and (idf.flash.load_window, idf.flash.app_image, idf.flash.flash_image) == (
        None,
        None,
        None,
    )
    assert rv32.flash is None and rv32.code_reserve == 0 and rv32.linker_script != p4.linker_script
    assert board_files(p4) == (p4.path,)


def test_tables_merge_key_by_key_and_every_other_value_replaces(tmp_path):
    mine = tmp_path / "my-idf.toml"
    mine.write_text(
        'extends = "esp32p4-idf"\nname = "my-idf"\ndefault_ctx = 64\nkernels = ["scalar"]\n'
        "[idf]\ncpu_mhz = 360\n[idf.sdkconfig]\nSPIRAM_SPEED_200M = false\n"
        '[[memory]]\nname = "psram"\nkind = "psram"\nbase = 0x48000000\nsize = 1048576\nholds = ["kv_cache"]\n'
    )
    board, idf = load_board(str(mine)), load_board("esp32p4-idf")
    assert (board.name, board.description, board.default_ctx, board.kernels) == (
        "my-idf",
        idf.description,
        64,
        ("scalar",),
    )
    assert board.path == mine and board_files(board) == (mine, idf.path, load_board("esp32p4").path)
    assert board.idf is not None and idf.idf is not None
    assert board.idf.cpu_mhz == 360 and board.idf.project_name == idf.idf.project_name  # [idf] merged
    assert board.idf.sdkconfig["SPIRAM_SPEED_200M"] is False and board.idf.sdkconfig["SPIRAM"] is True  # at every depth
    assert [m.name for m in board.memory] == ["psram"]  # an array of tables replaces the parent's whole
    assert board.flash == idf.flash and board.cflags == idf.cflags  # from the parent, and the parent's parent


@pytest.fixture
def targets(tmp_path, monkeypatch):
    """A targets/ folder of its own, holding host's file as "base" and esp32p4's as "p4"."""
    (tmp_path / "base.toml").write_text(load_board("host").path.read_text().replace('name = "host"', 'name = "base"'))
    (tmp_path / "p4.toml").write_text(load_board("esp32p4").path.read_text())
    monkeypatch.setattr(load_module, "TARGETS_DIR", tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    "files, message",
    [
        (
            {"a": 'extends = "nothing"\nname = "a"'},
            r"a.toml: extends 'nothing', which is not a board of targets/ "
            r"\(available: a, base, p4\)",
        ),
        ({"a": 'extends = "../base"\nname = "a"'}, r"a.toml: extends '../base', which is not a board of targets/"),
        ({"a": 'extends = "a"\nname = "a"'}, r"a.toml: extends loops: a -> a$"),
        (
            {"a": 'extends = "b"\nname = "a"', "b": 'extends = "c"\nname = "b"', "c": 'extends = "a"\nname = "c"'},
            r"c.toml: extends loops: a -> b -> c -> a$",
        ),
        ({"a": 'extends = "base"'}, r"a.toml: a board that extends base must set its own name"),
        (
            {"a": 'extends = "base"\nname = "a"\nunset = ["toolchain.linker_script"]'},
            r"a.toml: unset names toolchain.linker_script, which base does not have",
        ),
        ({"a": 'extends = "base"\nname = "a"\nunset = "flash"'}, r"a.toml: unset must list dotted keys, got 'flash'"),
        ({"a": 'name = "a"\nunset = ["flash"]'}, r"a.toml: unset is for a board that extends another"),
        ({"a": 'extends = "base"\nname = "a"\n[runner]\nkind = "ssh"'}, r"a.toml: malformed board file \(runner kind"),
    ],
)
def test_a_missing_or_looping_parent_and_a_wrong_unset_are_refused_in_one_line(targets, files, message):
    for name, text in files.items():
        (targets / f"{name}.toml").write_text(text + "\n")
    with pytest.raises(ColibriError, match=message) as e:
        load_board(str(targets / "a.toml"))
    assert "\n" not in str(e.value)


def test_a_board_extending_one_may_drop_a_whole_table(targets):
    (targets / "a.toml").write_text('extends = "p4"\nname = "a"\nunset = ["selftest", "toolchain.apt"]\n')
    board, p4 = load_board(str(targets / "a.toml")), load_board(str(targets / "p4.toml"))
    assert p4.selftest.boot and not board.selftest.boot  # no [selftest]: the defaults
    assert board.apt_packages == () and p4.apt_packages != ()
    assert (board.runner, board.memory, board.flash, board.cflags) == (p4.runner, p4.memory, p4.flash, p4.cflags)
