"""The Linux firmware asks for its KV cache in 2 MiB pages (transparent huge pages on request,
firmware_src/bsp/linux/image_map.c, from main.c) before it says hello: at a long context each KV head's keys and
values are read as streams of hundreds of KiB, which 4 KiB pages break up (docs/performance.md,
"At 4,096 positions"). Weights that fit in memory are read into it in 2 MiB pages as well
("Weights in 2 MiB pages"); --map-weights keeps the file's mapping."""

import os
import subprocess

from elftools.elf.elffile import ELFFile

from generator.device.protocol import FrameReader
from generator.device.session import RunRequest, request_frame
from models import ORACLE_CONFIGS, make_checkpoint

CTX = 32768  # 2 layers x 48 KV values x 2 bytes a position: 6 MiB of keys, room for whole 2 MiB pages


def symbol_address(program, name: str) -> tuple[int, int, bool]:
    """A symbol's address in the ELF, its size, and whether the program is loaded at a base (PIE)."""
    with open(program, "rb") as f:
        elf = ELFFile(f)
        (sym,) = elf.get_section_by_name(".symtab").get_symbol_by_name(name)
        return sym["st_value"], sym["st_size"], elf["e_type"] == "ET_DYN"


def vm_flags(pid: int, address: int) -> list[str]:
    """The VmFlags of the mapping of process pid that holds address."""
    inside = False
    for line in open(f"/proc/{pid}/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= address < end
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def load_base(pid: int, program) -> int:
    real = os.path.realpath(program)
    for line in open(f"/proc/{pid}/maps"):
        fields = line.split()
        if len(fields) >= 6 and fields[5] == real and int(fields[2], 16) == 0:
            return int(fields[0].split("-")[0], 16)
    raise AssertionError("the program's first mapping was not found")


def test_the_kv_cache_is_advised_into_huge_pages_before_hello(builder, tmp_path):
    config_cls, model_cls, kwargs = ORACLE_CONFIGS["llama_gqa_linear"]
    model = make_checkpoint((config_cls, model_cls, dict(kwargs, max_position_embeddings=CTX)), tmp_path / "model")
    _, art, _ = builder.build(model, "q8_0", CTX)
    proc = subprocess.Popen(
        [str(art.program), "--weights", str(art.weights)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        reader, frames = FrameReader(), []
        while not any(f.kind == "hello" for f in frames):
            chunk = os.read(proc.stdout.fileno(), 65536)
            assert chunk, "the firmware ended before its hello"
            frames += reader.feed(chunk)
        for name in ("colibri_key_cache", "colibri_value_cache"):
            at, size, relocated = symbol_address(art.program, name)
            assert size >= 6 << 20
            middle = (load_base(proc.pid, art.program) if relocated else 0) + at + size // 2
            assert "hg" in vm_flags(proc.pid, middle), f"{name} is not advised into huge pages"
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def image_mapping(pid: int, size: int) -> tuple[int, str]:
    """(start, backing file or "") of the one mapping of process pid that is `size` bytes long."""
    found = []
    for line in open(f"/proc/{pid}/maps"):
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if end - start == size:
            found.append((start, fields[5] if len(fields) >= 6 else ""))
    assert len(found) == 1, found
    return found[0]


def held_weights(art, *options: str) -> tuple[int, str, list[str]]:
    """How a firmware run holds the image once it has answered a request: its mapping's start on a
    2 MiB boundary or not (start % 2 MiB), its backing file ("" for private memory), its VmFlags."""
    proc = subprocess.Popen(
        [str(art.program), "--weights", str(art.weights), *options], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        proc.stdin.write(request_frame(RunRequest([1, 2, 3], 2)))
        proc.stdin.flush()
        reader, frames = FrameReader(), []
        while not any(f.kind in ("done", "error") for f in frames):
            chunk = os.read(proc.stdout.fileno(), 65536)
            assert chunk, "the firmware ended before its answer"
            frames += reader.feed(chunk)
        assert frames[-1].kind == "done", frames[-1]
        size = (art.weights.stat().st_size + 4095) // 4096 * 4096
        start, backing = image_mapping(proc.pid, size)
        return start % (2 << 20), backing, vm_flags(proc.pid, start)
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_weights_that_fit_in_memory_are_read_into_huge_pages_and_mapped_ones_are_not(builder, checkpoints):
    _, art, _ = builder.build(checkpoints("llama_gqa_linear"), "q8_0", 64)
    offset, backing, flags = held_weights(art)
    assert offset == 0 and backing == "" and "hg" in flags  # private memory, advised, on a 2 MiB boundary
    offset, backing, flags = held_weights(art, "--map-weights")
    assert backing == os.path.realpath(art.weights) and "hg" not in flags
