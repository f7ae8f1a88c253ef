"""An MCU reports its margins: the stats frame carries the stack's high-water mark (over the stack
painted at start-up) and the largest heap use; verify compares them with the stack the linked ELF
reserves and keeps them for report, and both warn with under 10 % left."""

from __future__ import annotations

import json

import pytest
from conftest import DEFAULT_MODEL

from generator.compile.elfsize import read_elf
from generator.verify import Margins


@pytest.mark.slow
def test_qemu_rv32_reports_its_stack_high_water_mark_and_report_shows_it_after_verify(builder, capsys):
    from generator.cli import main

    _, art, _ = builder.build(DEFAULT_MODEL, ctx=64, board="qemu-rv32")
    (art.out_dir / "margins.json").unlink(missing_ok=True)
    where = ["--board", "qemu-rv32", "--ctx", "64", "--out", str(art.out_dir)]

    capsys.readouterr()
    assert main(["report", *where, "--json"]) == 0
    assert "margins" not in json.loads(capsys.readouterr().out)  # nothing measured yet

    assert main(["verify", *where, "--prompt-ids", "1,5,9", "--steps", "3", "--json"]) == 0
    margins = json.loads(capsys.readouterr().out)["stats"]["margins"]
    reserved = read_elf(art.program).sections[".stack"]
    assert margins["stack_size"] == reserved  # the frame's stack is the one the linker script reserves
    # a decode and the boot self-test used some of it, far from all: the paint was overwritten, not all of it
    assert 1024 < margins["stack_used"] < reserved
    assert (margins["heap_peak"], margins["heap_size"]) == (0, 0)  # static arenas, no heap linked

    assert main(["report", *where, "--json"]) == 0
    reported = json.loads(capsys.readouterr().out)["margins"]
    assert reported["stack_used"] == margins["stack_used"] and reported["planned_stack"] == reserved
    assert reported["warnings"] == []
    assert main(["report", *where]) == 0
    assert f"measured by the last verify of this build: stack: {margins['stack_used']:,} B of {reserved:,} B" in (
        capsys.readouterr().out
    )


def test_under_a_tenth_of_the_stack_or_heap_left_is_warned():
    roomy = Margins(stack_used=2828, stack_size=65536, heap_peak=0, heap_size=0)
    assert roomy.warnings() == [] and roomy.line().endswith("(96% left); heap: none (static arenas)")
    tight = Margins(stack_used=7600, stack_size=8192, heap_peak=0, heap_size=0)  # esp32p4's 8 KiB
    (warning,) = tight.warnings()
    assert warning.startswith("the firmware used 7,600 B of its 8,192 B stack at most: 7.2% left (under 10%)")
    # against the plan: the ELF's .stack, where it differs from what the frame said
    assert tight.warnings(planned_stack=65536) == []
    heap = Margins(stack_used=100, stack_size=8192, heap_peak=950, heap_size=1000)
    assert heap.warnings() == ["the firmware used 950 B of its 1,000 B heap at most: 5.0% left (under 10%)"]
    assert Margins.of({"stack_used": "10"}) is None  # a board that does not measure them
