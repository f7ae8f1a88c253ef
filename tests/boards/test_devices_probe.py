"""./colibri devices --probe: each ESP32 port read through the real esptool (chip, revision, flash
size, PSRAM where the chip says, MAC), the board files' assumptions checked against it, one line per
problem; a fake ESP32-P4 in its ROM loader on a pseudo-terminal (tests/esp_rom_pty.py) answers."""

from __future__ import annotations

import json

from esp_rom_pty import FakeChip

from generator.cli import main


def probe(capsys, chip: FakeChip, *options: str) -> tuple[int, list[str]]:
    """devices --probe of the fake chip's port (no DTR/RTS on a pty: --before no-reset): status, stdout lines."""
    capsys.readouterr()
    with chip:
        status = main(["devices", "--probe", "--port", chip.port, "--before", "no-reset", *options])
    return status, capsys.readouterr().out.splitlines()


def test_a_p4_that_matches_its_board_file_is_described_and_passes(capsys, tmp_path):
    chip = FakeChip(mac=bytes.fromhex("60550f00abcd"), revision=301)
    status, lines = probe(capsys, chip, "--board", "esp32p4", "--out", str(tmp_path))
    assert status == 0, lines
    assert lines[0] == (
        f"{chip.port}: ESP32-P4 (revision v3.1), MAC 60:55:0f:00:ab:cd, 16MB flash, PSRAM not reported by the chip; "
        "Dual Core + LP Core, 400MHz"
    )
    assert lines[1] == "the board file holds for every chip found"


def test_a_revision_whose_l2mem_is_not_free_is_one_problem_line(capsys, tmp_path):
    status, lines = probe(capsys, FakeChip(revision=200), "--board", "esp32p4", "--out", str(tmp_path))
    assert status == 1
    problems = [line for line in lines if line.startswith("PROBLEM ")]
    assert len(problems) == 1
    assert "revision v2.0: the image loads into L2MEM 0x4ff40000-0x4ffa0000" in problems[0]
    assert problems[0].endswith("leaves free on revisions v1.x, v3.x only")


def test_a_flash_smaller_than_the_board_file_says_names_the_header_and_the_partition_table(capsys, tmp_path):
    status, lines = probe(capsys, FakeChip(revision=301, flash_size=4 << 20), "--board", "esp32p4-idf", "--json")
    assert status == 1
    doc = json.loads("\n".join(lines))
    assert doc["chips"][0]["flash_size"] == "4MB" and doc["chips"][0]["revision"] == "v3.1"
    problems = doc["problems"]
    assert len(problems) == 2, problems
    assert problems[0].endswith("the images' headers say a 16MB flash ([flash] size), the chip has 4MB")
    assert problems[1].endswith("the partition table runs to 0x1000000 (partition weights), past the chip's 4MB flash")


def test_the_images_of_a_build_are_weighed_against_the_chips_flash(capsys, tmp_path):
    """A build of esp32p4 whose image ends past a 1 MB flash (its file made as big as a large model's)."""
    (tmp_path / "firmware.bin").write_bytes(b"\xe9" + bytes(0x100000))
    status, lines = probe(
        capsys, FakeChip(revision=101, flash_size=1 << 20), "--board", "esp32p4", "--out", str(tmp_path)
    )
    assert status == 1
    problems = [line for line in lines if line.startswith("PROBLEM ")]
    assert any("the images' headers say a 4MB flash" in p for p in problems), problems
    assert any(
        f"{tmp_path}: firmware.bin at 0x2000 (1,048,577 B) ends at 0x102001, past the chip's 1MB flash" in p
        for p in problems
    )


def test_another_chip_is_named(capsys, tmp_path):
    status, lines = probe(capsys, FakeChip(chip_id=9), "--board", "esp32p4", "--out", str(tmp_path))
    assert status == 1
    assert any(line.endswith("found ESP32-S3; board esp32p4 needs an ESP32-P4") for line in lines), lines


def test_with_no_board_it_lists_what_each_board_needs_here(capsys, monkeypatch):
    from generator.device import ports

    monkeypatch.setattr(ports, "list_ports", lambda: [])  # this machine's serial ports are not the test's
    capsys.readouterr()
    assert main(["devices", "--probe"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("no board plugged in")
    shown = {line.split()[0]: line for line in lines[1:]}
    assert {"host", "qemu-rv32", "esp32p4", "esp32p4-idf", "linux-aarch64"} <= set(shown)
    assert "gcc " in shown["host"] and "idf.py" in shown["esp32p4-idf"]


def test_probe_options_without_probe_are_refused(capsys):
    assert main(["devices", "--board", "esp32p4"]) == 2
    assert "--port, --board and --out go with --probe" in capsys.readouterr().err


def test_a_board_whose_sysroot_is_not_made_says_so_and_how_to_make_it(capsys, monkeypatch, tmp_path):
    """linux-aarch64-mpi links against an arm64 Open MPI sysroot the setup makes: with none made,
    its line says NOT READY, where the sysroot goes and the setup step that makes it, and --json
    the same; once made (its stamp written), that part is gone."""
    from generator.boards import load_board
    from generator.boards.board import MADE_STAMP
    from generator.device import ports

    monkeypatch.setattr(ports, "list_ports", lambda: [])
    monkeypatch.setenv("COLIBRI_SYSROOTS", str(tmp_path))  # no sysroot made there
    sysroot = load_board("linux-aarch64-mpi").sysroot.path()
    capsys.readouterr()
    assert main(["devices", "--probe"]) == 0
    shown = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    line = shown["linux-aarch64-mpi"]
    assert "NOT READY" in line
    assert (
        f"the arm64 sysroot {sysroot} is not made: make it with "
        "`.venv/bin/python -m generator.device.setup_toolchain linux-aarch64-mpi` (mmdebstrap, about a minute)"
    ) in line
    assert "sysroot" not in shown["linux-aarch64"]
    assert main(["devices", "--probe", "--json"]) == 0
    needs = {b["board"]: b for b in json.loads(capsys.readouterr().out)["boards"]}
    assert needs["linux-aarch64-mpi"]["sysroot_missing"] == str(sysroot)
    assert needs["linux-aarch64-mpi"]["ready"] is False
    (sysroot).mkdir(parents=True)
    (sysroot / MADE_STAMP).write_text("")
    assert main(["devices", "--probe"]) == 0
    assert "sysroot" not in capsys.readouterr().out
