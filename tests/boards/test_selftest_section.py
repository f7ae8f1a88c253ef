"""The board file's [selftest] section: parsed and checked when the board loads, carried into
board_def.h (COLIBRI_SELFTEST_AT_BOOT and the golden decode's size)."""

from __future__ import annotations

import pytest

from generator.boards import load_board, read_board_file
from generator.boards.load import board_from_data
from generator.compile.emit import board_context, environment
from generator.errors import ColibriError


def with_section(name: str, section: dict | None):
    board = load_board(name)
    data = read_board_file(board.path)
    data.pop("selftest", None)
    if section is not None:
        data["selftest"] = section
    return board_from_data(data, board.path)


def test_mcu_boards_run_it_at_boot_and_linux_boards_when_asked():
    assert load_board("qemu-rv32").selftest.boot and load_board("esp32p4").selftest.boot
    assert not load_board("host").selftest.boot and not load_board("linux-aarch64").selftest.boot


def test_boot_false_turns_the_boot_run_off_in_board_def_h():
    board = with_section("qemu-rv32", {"boot": False, "steps": 2})
    text = environment().get_template("board_def.h.j2").render(board_context(board), fw_version="test")
    assert "#define COLIBRI_SELFTEST_AT_BOOT 0" in text and "#define COLIBRI_SELFTEST_STEPS 2" in text
    on = environment().get_template("board_def.h.j2").render(board_context(load_board("qemu-rv32")), fw_version="t")
    assert "#define COLIBRI_SELFTEST_AT_BOOT 1" in on


@pytest.mark.parametrize(
    "name, section, problem",
    [
        ("host", {"boot": True}, "boot is for MCU boards"),
        ("qemu-rv32", {"boot": "yes"}, "boot must be true or false"),
        ("qemu-rv32", {"steps": 0}, "between 1 and 64"),
        ("qemu-rv32", {"prompt": 3}, "unknown keys ['prompt']"),
    ],
)
def test_a_bad_section_is_one_line_naming_the_file(name, section, problem):
    with pytest.raises(ColibriError) as e:
        with_section(name, section)
    assert f"{name}.toml: malformed board file" in str(e.value) and problem in str(e.value)
