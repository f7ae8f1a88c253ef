"""Board esp32p4-idf: the generated ESP-IDF project is complete, consistent with the board file,
reproducible and relocatable; its portable C builds for the P4's ISA; its BSP, run on this machine
against a simulated ESP-IDF (partition, UART, timer), loads the image from a partition and
decodes exactly what the reference decodes; a missing ESP-IDF is a clear error."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from c_builds import gcc
from conftest import DEFAULT_MODEL, REPO

from generator.boards import board_from_data, kernel_set_sources, load_board, read_board_file
from generator.compile.esp32 import idf_project
from generator.compile.esp32.idf_build import find_idf, idf_build
from generator.compile.esp32.idf_project import COLIBRI_DIR, write_project
from generator.compile.esp32.partitions import parse_partitions_csv
from generator.compile.image import read_header
from generator.compile.layout import align_up
from generator.compile.pipeline import generate
from generator.device.protocol import FrameReader, encode_request
from generator.errors import ColibriError
from generator.numerics.sampling import SamplingParams
from generator.reference import Reference
from generator.selftest import GOLDEN_FILE, write_golden

pytestmark = pytest.mark.slow  # generates and checks ESP-IDF projects

BOARD = "esp32p4-idf"
RISCV_CC = "riscv64-unknown-elf-gcc"


@pytest.fixture(scope="module")
def board():
    return load_board(BOARD)


class Project:
    def __init__(self, root: Path, gen: Path, generated):
        self.root, self.gen, self.generated = root, gen, generated
        self.plan = generated.plan

    def text(self, rel: str) -> str:
        return (self.root / rel).read_text()

    def files(self) -> dict[str, bytes]:
        return {
            p.relative_to(self.root).as_posix(): p.read_bytes() for p in sorted(self.root.rglob("*")) if p.is_file()
        }


def make_project(board, model: Path, where: Path, quant="q8_0", ctx=None) -> Project:
    gen = where / "generated"
    generated = generate(model, board, quant, ctx, gen)
    write_golden(generated.plan, gen / "weights.img", board, gen / GOLDEN_FILE)  # the SConstruct's GOLDEN step
    root = where / "project"
    written = write_project(board, generated.plan, gen, root, REPO)
    assert written == sorted(written) and all(p.is_file() for p in written)
    return Project(root, gen, generated)


@pytest.fixture(scope="module")
def projects(board, checkpoints, tmp_path_factory):
    """The bundled default model and a tiny Qwen2 checkpoint (biases), each as a generated project."""
    return {
        "kjv-tiny": make_project(board, DEFAULT_MODEL, tmp_path_factory.mktemp("idf-kjv")),
        "qwen2": make_project(board, checkpoints("qwen2_bias"), tmp_path_factory.mktemp("idf-qwen2"), ctx=48),
    }


PROJECTS = ["kjv-tiny", "qwen2"]


# ---- The board file ----


def test_board_file_describes_the_p4_with_idf(board):
    assert (
        board.runner.needs_port
        and board.runner.kind == "serial"
        and board.weights == "partition"
        and board.bsp == BOARD
    )
    regions = {r.name: r for r in board.memory}
    assert (regions["l2mem"].kind, regions["l2mem"].base, set(regions["l2mem"].holds)) == (
        "sram",
        0x4FF00000,
        {"code", "rope_tables"},
    )
    assert regions["l2mem"].base + regions["l2mem"].size == 0x4FFC0000
    assert (regions["psram"].kind, regions["psram"].base, regions["psram"].size, set(regions["psram"].holds)) == (
        "psram",
        0x48000000,
        32 << 20,
        {"expanded_weights", "kv_cache", "scratch"},
    )
    assert (regions["flash"].kind, regions["flash"].base, regions["flash"].holds) == ("flash", 0x40000000, ("weights",))
    placed = [c for r in board.memory for c in r.holds]
    assert (
        sorted(placed)
        == sorted(set(placed))
        == sorted(["code", "weights", "expanded_weights", "kv_cache", "scratch", "rope_tables"])
    )
    assert "-mabi=ilp32f" in board.cflags and "-ffp-contract=off" in board.cflags
    assert any(f.startswith("-march=rv32imafc") for f in board.cflags)

    s = board.idf
    images = {name: img.offset for name, img in s.images.items()}
    assert images == {
        "bootloader": 0x2000,
        "partition-table": 0x8000,
        "otadata": 0xD000,
        "app": 0x10000,
        "weights": 0x200000,
    }
    assert s.ota_slots == (0x10000, 0x100000) and s.images["otadata"].size == 0x2000  # two sectors
    assert s.ota_slots[1] + s.images["app"].size <= s.images["weights"].offset  # ota_1 ends before the weights
    assert (s.chip, s.chip_id, s.flash_mode, s.target) == ("esp32p4", 18, "dio", "esp32p4")
    assert s.images["weights"].offset + s.images["weights"].size == s.flash_bytes
    assert s.images["weights"].size == regions["flash"].size  # the budget `report` checks is the partition's
    assert s.images["app"].offset + s.images["app"].size <= s.images["weights"].offset
    assert s.supported_revisions == (3,) and s.min_revision == 301 and s.cpu_mhz == 400


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["flash"].update(supported_revisions=[1, 3]), "not both"),
        (lambda d: d["flash"].update(min_revision=100), "min_revision 100"),
        (
            lambda d: d["idf"].update(cpu_mhz=400) or d["flash"].update(supported_revisions=[1], min_revision=100),
            "cpu_mhz 400",
        ),
        (lambda d: d["flash"]["images"].pop(), "no entry named 'weights'"),
        (lambda d: d["flash"]["images"][4].update(offset=0x208000), "64 KiB boundaries"),
        (lambda d: d["idf"].update(ota_slots=[0x10000]), "2 to 16 app slots"),
        (lambda d: d["idf"].update(ota_slots=[0x100000, 0x10000]), "ota_slots starts at 0x100000"),
        (lambda d: d["flash"]["images"][2].update(size=0x1000), "two 4 KiB sectors"),
        (lambda d: d["idf"].update(ota_slots=[0x10000, 0xF0000]), "overlap"),
        (lambda d: d["flash"].update(size="3MB"), "flash size '3MB'"),
        (lambda d: d["idf"].update(uart_num=1), "uart_num must be 0"),
        (lambda d: d["idf"]["sdkconfig"].update(IDF_TARGET="esp32"), None),  # checked when rendering
    ],
)
def test_malformed_idf_settings_are_refused_with_the_reason(board, change, message):
    data = read_board_file(board.path)
    change(data)
    if message is None:
        bad = board_from_data(data, board.path)
        with pytest.raises(ColibriError, match="IDF_TARGET"):
            idf_project.sdkconfig_entries(bad.idf)
        return
    with pytest.raises(ColibriError) as e:  # refused when the board file loads
        board_from_data(data, board.path)
    assert message in str(e.value) and "\n" not in str(e.value)


# ---- The project's files ----


@pytest.mark.parametrize("name", PROJECTS)
def test_partition_table_is_aligned_disjoint_and_holds_the_image(name, projects, board):
    p = projects[name]
    s = board.idf
    parts = parse_partitions_csv(p.text("partitions.csv"))
    names = [q.name for q in parts]
    assert names == ["nvs", "otadata", "ota_0", "ota_1", "weights"]
    image_bytes = (p.root / "weights.bin").stat().st_size
    assert image_bytes == p.plan.image.image_bytes
    lo = 0x8000 + 0x1000  # the partition table's sector
    for q in sorted(parts, key=lambda q: q.offset):
        assert q.offset % (0x10000 if q.type == "app" else 0x1000) == 0, q
        assert q.size % 0x1000 == 0 and q.size > 0, q
        assert q.offset >= lo, f"{q.name} overlaps the partition before it"
        lo = q.offset + q.size
    assert lo <= 16 << 20
    by_name = {q.name: q for q in parts}
    weights = by_name["weights"]
    assert (by_name["otadata"].type, by_name["otadata"].subtype, by_name["otadata"].size) == ("data", "ota", 0x2000)
    for i, offset in enumerate(s.ota_slots):  # each slot holds the app image flash writes into ota_0
        slot = by_name[f"ota_{i}"]
        assert (slot.type, slot.subtype, slot.offset, slot.size) == ("app", f"ota_{i}", offset, s.images["app"].size)
    assert (weights.type, weights.subtype, weights.flags) == ("data", "undefined", "readonly")
    assert weights.offset % 0x10000 == 0 and weights.offset == s.images["weights"].offset
    assert weights.size >= image_bytes and weights.size == align_up(image_bytes, 0x10000)


def parse_sdkconfig(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        m = re.fullmatch(r"CONFIG_([A-Z0-9_]+)=(.*)", line) or re.fullmatch(r"# CONFIG_([A-Z0-9_]+) is not set()", line)
        if m:
            assert m.group(1) not in values, f"{m.group(1)} set twice"
            values[m.group(1)] = m.group(2) if line.startswith("CONFIG_") else "n"
        else:
            assert line == "" or line.startswith("# "), f"not an sdkconfig line: {line!r}"
    return values


@pytest.mark.parametrize("name", PROJECTS)
def test_sdkconfig_defaults_set_psram_clock_optimisation_watchdog_and_partitions(name, projects):
    p = projects[name]
    cfg = parse_sdkconfig(p.text("sdkconfig.defaults"))
    required = {
        "IDF_TARGET": '"esp32p4"',
        "ESP32P4_SELECTS_REV_LESS_V3": "n",  # ESP-IDF 5.5.2 defaulted it to y: v3.x chips need it off
        "ESP32P4_REV_MIN_301": "y",
        "SPIRAM": "y",
        "SPIRAM_MODE_HEX": "y",
        "SPIRAM_ALLOW_BSS_SEG_EXTERNAL_MEMORY": "y",
        "ESP_DEFAULT_CPU_FREQ_MHZ_400": "y",
        "COMPILER_OPTIMIZATION_PERF": "y",
        "ESP_TASK_WDT_EN": "n",
        "PARTITION_TABLE_CUSTOM": "y",
        "PARTITION_TABLE_CUSTOM_FILENAME": '"partitions.csv"',
        "PARTITION_TABLE_OFFSET": "0x8000",
        "ESPTOOLPY_FLASHMODE_DIO": "y",
        "ESPTOOLPY_FLASHSIZE_16MB": "y",
        "ESP_CONSOLE_UART_DEFAULT": "y",
        "ESP_CONSOLE_UART_BAUDRATE": "115200",
        "APP_REPRODUCIBLE_BUILD": "y",
    }
    assert {k: cfg.get(k) for k in required} == required
    assert (p.root / "partitions.csv").is_file()


def cmake_block(text: str, keyword: str) -> list[str]:
    """The arguments after `keyword` inside idf_component_register(...), up to the next keyword."""
    body = re.search(r"idf_component_register\((.*?)\n\)", text, re.S).group(1)
    words = [w.strip('"') for w in body.split()]
    keywords = {"SRCS", "INCLUDE_DIRS", "REQUIRES", "PRIV_REQUIRES", "LDFRAGMENTS"}
    out, on = [], False
    for w in words:
        if w in keywords:
            on = w == keyword
        elif on:
            out.append(w)
    return out


@pytest.mark.parametrize("name", PROJECTS)
def test_cmake_files_list_every_copied_source_and_the_idf_pieces(name, projects, board):
    p = projects[name]
    root_cmake = p.text("CMakeLists.txt")
    lines = [ln for ln in root_cmake.splitlines() if ln and not ln.startswith("#")]
    assert lines[0].startswith("cmake_minimum_required(VERSION 3.")
    assert lines.index("include($ENV{IDF_PATH}/tools/cmake/project.cmake)") < lines.index("project(colibri_fw)")

    main = p.text("main/CMakeLists.txt")
    srcs = cmake_block(main, "SRCS")
    on_disk = sorted(f.relative_to(p.root / "main").as_posix() for f in (p.root / "main").rglob("*.c"))
    assert sorted(srcs) == on_disk and len(srcs) == len(set(srcs))
    src = REPO / "firmware_src"
    expected = (
        [f"colibri/runtime/{f.name}" for f in (src / "runtime").glob("*.c")]
        + [f"colibri/{f.relative_to(src).as_posix()}" for k in board.kernels for f in kernel_set_sources(k)]
        + [f"colibri/runtime/parallel/{board.parallel}.c"]
        + [f"colibri/runtime/ranks/{board.runner.ranks}.c"]
        + [f"colibri/app/{f.name}" for f in (src / "app").glob("*.c")]
        + ["colibri/bsp/esp32p4-idf/main.c", "colibri/generated/model_data.c", "colibri/generated/selftest_data.c"]
    )
    assert sorted(srcs) == sorted(expected)
    for rel in srcs:  # hand-written files are copied unchanged; generated ones are the generator's
        copy = p.root / "main" / rel
        origin = (p.gen / copy.name) if "/generated/" in rel else src / rel[len("colibri/") :]
        assert copy.read_bytes() == origin.read_bytes(), rel
    # Every header the copied sources include is there too.
    for c in (p.root / "main").rglob("*.[ch]"):
        for inc in re.findall(r'#include "([^"]+)"', c.read_text()):
            if inc.startswith(("esp_", "driver/", "freertos/")):
                continue
            assert (c.parent / inc).is_file() or (p.root / "main/colibri/generated" / inc).is_file(), (c, inc)

    (inc_dir,) = cmake_block(main, "INCLUDE_DIRS")
    assert (p.root / "main" / inc_dir / "model_def.h").read_bytes() == (p.gen / "model_def.h").read_bytes()
    assert {"esp_partition", "esp_driver_uart", "esp_timer"} <= set(cmake_block(main, "REQUIRES"))
    opts = re.search(r"target_compile_options\(\$\{COMPONENT_LIB\} PRIVATE(.*?)\)", main, re.S).group(1).split()
    assert (
        "-ffp-contract=off" in opts
        and "-fno-fast-math" in opts
        and not any("fast-math" in o and o != "-fno-fast-math" for o in opts)
    )
    assert 'esptool_py_flash_to_partition(flash "weights" "${PROJECT_DIR}/weights.bin")' in main

    (fragment,) = cmake_block(main, "LDFRAGMENTS")
    lf = (p.root / "main" / fragment).read_text()
    assert "archive: libmain.a" in lf
    objects = re.findall(r"^    (\w+) \((\w+)\)$", lf, re.M)
    basenames = {Path(s).stem for s in srcs}
    assert objects and all(obj in basenames for obj, _ in objects)
    assert ("model_data", "colibri_model_data") in objects and "bss -> extern_ram" in lf


@pytest.mark.parametrize("name", PROJECTS)
def test_weights_and_flash_args_say_what_goes_where(name, projects, board):
    p = projects[name]
    assert (p.root / "weights.bin").read_bytes() == (p.gen / "weights.img").read_bytes()
    assert read_header((p.root / "weights.bin").read_bytes()).model_hash == p.generated.model_hash
    first, *rows = p.text("flash_args").splitlines()
    assert first == "--flash-mode dio --flash-freq 80m --flash-size 16MB"
    written = {int(off, 16): path for off, path in (r.split() for r in rows)}
    s = board.idf
    assert written == {
        0x2000: "build/bootloader/bootloader.bin",
        0x8000: "build/partition_table/partition-table.bin",
        0xD000: "build/ota_data_initial.bin",  # idf.py's blank otadata: the bootloader starts ota_0
        0x10000: "build/colibri_fw.bin",
        s.images["weights"].offset: "weights.bin",
    }
    for offset, path in written.items():  # the same files, seen from the build directory
        assert any(img.offset == offset and img.file == f"{s.project_dir}/{path}" for img in s.images.values())
    readme = p.text("README.txt")
    assert p.generated.model_hash.hex() in readme and "0x200000  weights.bin" in readme


def test_the_project_is_reproducible_relocatable_and_free_of_absolute_paths(board, tmp_path, monkeypatch):
    a = make_project(board, DEFAULT_MODEL, tmp_path / "first place")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    b = make_project(board, DEFAULT_MODEL, tmp_path / "elsewhere" / "deeper")
    files_a, files_b = a.files(), b.files()
    assert files_a.keys() == files_b.keys()
    assert [k for k in files_a if files_a[k] != files_b[k]] == []
    # Relocatable: no path of this machine inside any file.
    needles = [str(tmp_path).encode(), str(REPO).encode(), str(Path.home()).encode(), b"/tmp/", b"/work/"]
    for rel, data in files_a.items():
        if rel == "weights.bin":
            continue
        assert not any(n in data for n in needles), rel
        assert b"\r" not in data and data.endswith(b"\n"), rel
    # Moving the project keeps it whole: every path inside is relative.
    moved = tmp_path / "moved"
    shutil.copytree(a.root, moved)
    assert {p.relative_to(moved).as_posix(): p.read_bytes() for p in moved.rglob("*") if p.is_file()} == files_a


def test_regenerating_replaces_stale_copies_but_leaves_idf_outputs(board, tmp_path):
    p = make_project(board, DEFAULT_MODEL, tmp_path)
    stale = p.root / COLIBRI_DIR / "runtime" / "kernels" / "old_kernel.c"
    stale.write_text("int old;\n")
    idf_out = p.root / "build" / "colibri_fw.bin"
    idf_out.parent.mkdir()
    idf_out.write_bytes(b"\xe9app")
    (p.root / "sdkconfig").write_text('CONFIG_IDF_TARGET="esp32p4"\n')
    before = p.files()
    del before["main/colibri/runtime/kernels/old_kernel.c"]
    write_project(board, p.plan, p.gen, p.root, REPO)
    assert not stale.exists()
    assert p.files() == before


def test_a_weight_image_larger_than_the_partition_is_refused_with_the_numbers(board, tmp_path):
    data = read_board_file(board.path)
    data["flash"]["images"][4]["size"] = 0x10000
    small = board_from_data(data, board.path)
    gen = tmp_path / "generated"
    generated = generate(DEFAULT_MODEL, small, "q8_0", 64, gen)
    write_golden(generated.plan, gen / "weights.img", small, gen / GOLDEN_FILE)
    with pytest.raises(ColibriError) as e:
        write_project(small, generated.plan, gen, tmp_path / "project", REPO)
    assert f"{generated.plan.image.image_bytes:,} B" in str(e.value) and "65,536 B" in str(e.value)
    assert not (tmp_path / "project").exists()


def test_inputs_that_do_not_match_are_refused(board, projects, tmp_path):
    p = projects["kjv-tiny"]
    with pytest.raises(ColibriError, match="lacks"):
        write_project(board, p.plan, tmp_path / "nothing", tmp_path / "out", REPO)
    other = dataclasses.replace(p.plan, board="host")
    with pytest.raises(ColibriError, match="board host"):
        write_project(board, other, p.gen, tmp_path / "out", REPO)
    shutil.copytree(p.gen, tmp_path / "gen")
    (tmp_path / "gen" / "weights.img").write_bytes(b"not an image at all" * 10)
    with pytest.raises(ColibriError, match="bad magic"):
        write_project(board, p.plan, tmp_path / "gen", tmp_path / "out", REPO)
    # An image of the same layout from another generation (other weights) than model_data.c.
    from damaged_images import header

    image = (p.gen / "weights.img").read_bytes()
    image = header(image, "model_hash", bytes(b ^ 0xFF for b in read_header(image).model_hash))
    (tmp_path / "gen" / "weights.img").write_bytes(bytes(image))
    with pytest.raises(ColibriError, match="different generations"):
        write_project(board, p.plan, tmp_path / "gen", tmp_path / "out", REPO)
    assert not (tmp_path / "out").exists()


# ---- The C sources, for the P4's ISA ----


def needs_idf(path: Path) -> bool:
    return bool(re.search(r'#include "(esp_|driver/|freertos/)', path.read_text()))


@pytest.mark.parametrize("name", PROJECTS)
@pytest.mark.parametrize("std", ["board", "-std=gnu2x"])  # ESP-IDF 6 compiles with -std=gnu23
def test_portable_sources_compile_for_the_p4_with_the_board_flags(name, std, projects, board, tmp_path):
    if shutil.which(RISCV_CC) is None:
        pytest.skip(f"{RISCV_CC} is not installed (./colibri setup-toolchain --board {BOARD})")
    p = projects[name]
    sources = sorted((p.root / "main").rglob("*.c"))
    portable = [s for s in sources if not needs_idf(s)]
    assert [s.name for s in sources if needs_idf(s)] == ["main.c"]  # only the BSP needs ESP-IDF
    assert any(s.name == "model_data.c" for s in portable) and len(portable) == len(sources) - 1
    flags = list(board.cflags) + ([std] if std != "board" else [])
    for source in portable:
        obj = tmp_path / (source.stem + ".o")
        done = subprocess.run(
            [RISCV_CC, *flags, "-I", str(p.root / "main/colibri/generated"), "-c", str(source), "-o", str(obj)],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, f"{source.name}: {done.stderr}"
        head = obj.read_bytes()[:52]
        assert head[:4] == b"\x7fELF" and head[4] == 1  # ELF32
        machine = int.from_bytes(head[18:20], "little")
        e_flags = int.from_bytes(head[36:40], "little")
        assert machine == 243 and e_flags & 0x6 == 0x2 and e_flags & 0x1  # RISC-V, single-float ABI, RVC


# ---- The BSP, on this machine, against a simulated ESP-IDF ----

STUB_HEADERS = {
    "esp_err.h": """
typedef int esp_err_t;
#define ESP_OK 0
#define ESP_FAIL -1
""",
    "esp_app_desc.h": """
#include <stdint.h>
typedef struct { uint8_t app_elf_sha256[32]; } esp_app_desc_t;
const esp_app_desc_t *esp_app_get_description(void);
""",
    "esp_timer.h": """
#include <stdint.h>
int64_t esp_timer_get_time(void);
""",
    "freertos/FreeRTOS.h": """
#include <stdint.h>
typedef uint32_t TickType_t;
typedef unsigned int UBaseType_t;
#define portMAX_DELAY ((TickType_t)0xffffffffu)
#define pdMS_TO_TICKS(ms) ((TickType_t)(ms))
""",
    "freertos/task.h": """
typedef struct tskTaskControlBlock *TaskHandle_t;
void vTaskDelay(TickType_t ticks);
UBaseType_t uxTaskGetStackHighWaterMark(TaskHandle_t xTask);
""",
    # ESP-IDF's components/heap/include/esp_heap_caps.h (v5.x): these names, values and signatures.
    "esp_heap_caps.h": """
#include <stddef.h>
#include <stdint.h>
#define MALLOC_CAP_8BIT (1 << 2)
#define MALLOC_CAP_SPIRAM (1 << 10)
#define MALLOC_CAP_INTERNAL (1 << 11)
#define MALLOC_CAP_DEFAULT (1 << 12)
size_t heap_caps_get_total_size(uint32_t caps);
size_t heap_caps_get_minimum_free_size(uint32_t caps);
""",
    # ESP-IDF's components/esp_system/include/esp_task.h: the main task's stack, which
    # components/freertos/app_startup.c creates the task that runs app_main with.
    "esp_task.h": """
#include "sdkconfig.h"
#ifdef CONFIG_NEWLIB_NANO_FORMAT
#define TASK_EXTRA_STACK_SIZE (0)
#else
#define TASK_EXTRA_STACK_SIZE (512)
#endif
#define ESP_TASK_MAIN_STACK (CONFIG_ESP_MAIN_TASK_STACK_SIZE + TASK_EXTRA_STACK_SIZE)
""",
    "driver/uart.h": """
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "esp_err.h"
#include "freertos/FreeRTOS.h"
typedef int uart_port_t;
typedef void *QueueHandle_t;
esp_err_t uart_driver_install(uart_port_t uart_num, int rx_buffer_size, int tx_buffer_size, int queue_size,
                              QueueHandle_t *uart_queue, int intr_alloc_flags);
int uart_read_bytes(uart_port_t uart_num, void *buf, uint32_t length, TickType_t ticks_to_wait);
int uart_write_bytes(uart_port_t uart_num, const void *src, size_t size);
""",
    "esp_partition.h": """
#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include "esp_err.h"
typedef enum { ESP_PARTITION_TYPE_APP = 0x00, ESP_PARTITION_TYPE_DATA = 0x01 } esp_partition_type_t;
typedef enum { ESP_PARTITION_SUBTYPE_DATA_UNDEFINED = 0x06, ESP_PARTITION_SUBTYPE_ANY = 0xff } esp_partition_subtype_t;
typedef enum { ESP_PARTITION_MMAP_DATA, ESP_PARTITION_MMAP_INST } esp_partition_mmap_memory_t;
typedef uint32_t esp_partition_mmap_handle_t;
typedef struct {
    void *flash_chip; esp_partition_type_t type; esp_partition_subtype_t subtype;
    uint32_t address; uint32_t size; uint32_t erase_size; char label[17]; bool encrypted; bool readonly;
} esp_partition_t;
const esp_partition_t *esp_partition_find_first(esp_partition_type_t type, esp_partition_subtype_t subtype,
                                                const char *label);
esp_err_t esp_partition_mmap(const esp_partition_t *partition, size_t offset, size_t size,
                             esp_partition_mmap_memory_t memory, const void **out_ptr,
                             esp_partition_mmap_handle_t *out_handle);
""",
    "esp_system.h": """
void esp_restart(void);
""",
    "esp_ota_ops.h": """
#include "esp_err.h"
#include "esp_partition.h"
typedef enum {
    ESP_OTA_IMG_NEW = 0, ESP_OTA_IMG_PENDING_VERIFY = 1, ESP_OTA_IMG_VALID = 2, ESP_OTA_IMG_INVALID = 3,
    ESP_OTA_IMG_ABORTED = 4, ESP_OTA_IMG_UNDEFINED = -1
} esp_ota_img_states_t;
const esp_partition_t *esp_ota_get_running_partition(void);
esp_err_t esp_ota_get_state_partition(const esp_partition_t *partition, esp_ota_img_states_t *ota_state);
esp_err_t esp_ota_mark_app_valid_cancel_rollback(void);
esp_err_t esp_ota_mark_app_invalid_rollback_and_reboot(void);
""",
}

# The simulated ESP-IDF: the partition is a file (COLIBRI_PARTITION), absent if COLIBRI_LABEL differs
# from the label the firmware asks for; UART0 is stdin/stdout; the firmware ends when stdin does.
STUB_C = r"""
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "driver/uart.h"
#include "esp_partition.h"
#include "esp_timer.h"
#include "esp_app_desc.h"
#include "esp_ota_ops.h"
#include "esp_system.h"
#include "esp_heap_caps.h"
#include "freertos/task.h"

void app_main(void);

static const esp_app_desc_t app_desc = {{0xc0, 0x11, 0xb7, 0x1d}};

const esp_app_desc_t *esp_app_get_description(void)
{
    return &app_desc;
}

static esp_partition_t part;
static int installed;
static int64_t idle_us; /* time that passed in simulated silent reads */

int64_t esp_timer_get_time(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000 + idle_us;
}

void vTaskDelay(TickType_t ticks) { (void)ticks; exit(3); }

esp_err_t uart_driver_install(uart_port_t n, int rx, int tx, int q, QueueHandle_t *queue, int flags)
{
    if (n != 0 || rx <= 128 || tx != 0 || q != 0 || queue != NULL || flags != 0) return ESP_FAIL;
    installed = 1;
    return ESP_OK;
}

int uart_read_bytes(uart_port_t n, void *buf, uint32_t length, TickType_t wait)
{
    (void)wait;
    if (!installed || n != 0) { fprintf(stderr, "uart read before install\n"); exit(4); }
    static int silent = -1; /* COLIBRI_SILENT_READS: that many reads time out first, 1 s each */
    if (silent < 0) silent = getenv("COLIBRI_SILENT_READS") ? atoi(getenv("COLIBRI_SILENT_READS")) : 0;
    if (silent > 0) { silent--; idle_us += 1000000; return 0; }
    ssize_t got = read(0, buf, length > 7 ? 7 : length); /* small reads: lines arrive in pieces */
    if (got <= 0) { fflush(stdout); exit(0); }
    return (int)got;
}

int uart_write_bytes(uart_port_t n, const void *src, size_t size)
{
    if (!installed || n != 0) { fprintf(stderr, "uart write before install\n"); exit(4); }
    fwrite(src, 1, size, stdout);
    fflush(stdout);
    return (int)size;
}

const esp_partition_t *esp_partition_find_first(esp_partition_type_t type, esp_partition_subtype_t subtype,
                                                const char *label)
{
    const char *have = getenv("COLIBRI_LABEL");
    if (type != ESP_PARTITION_TYPE_DATA || subtype != ESP_PARTITION_SUBTYPE_DATA_UNDEFINED || label == NULL ||
        strcmp(label, have ? have : "weights") != 0) return NULL;
    FILE *f = fopen(getenv("COLIBRI_PARTITION"), "rb");
    if (f == NULL) return NULL;
    fseek(f, 0, SEEK_END);
    part.size = (uint32_t)ftell(f);
    fclose(f);
    part.type = type; part.subtype = subtype; part.address = 0x200000; part.readonly = true;
    strcpy(part.label, label);
    return &part;
}

esp_err_t esp_partition_mmap(const esp_partition_t *p, size_t offset, size_t size, esp_partition_mmap_memory_t memory,
                             const void **out, esp_partition_mmap_handle_t *handle)
{
    if (p != &part || offset != 0 || size != p->size || memory != ESP_PARTITION_MMAP_DATA) return ESP_FAIL;
    uint8_t *buf = aligned_alloc(65536, ((size_t)p->size + 65535) / 65536 * 65536);
    FILE *f = fopen(getenv("COLIBRI_PARTITION"), "rb");
    if (buf == NULL || f == NULL || fread(buf, 1, p->size, f) != p->size) return ESP_FAIL;
    fclose(f);
    *out = buf;
    *handle = 1;
    return ESP_OK;
}

/* OTA: COLIBRI_OTA_STATE is the running app's otadata state (unset: no entry, an app flashed over
 * serial); marking it valid says so on stderr, rolling back ends the process with 6 (the reboot),
 * or returns when COLIBRI_OTA_NO_PREVIOUS is set (nothing to go back to), and esp_restart ends with 7. */
static const esp_partition_t running = {.type = ESP_PARTITION_TYPE_APP, .address = 0x10000, .size = 0xF0000};

const esp_partition_t *esp_ota_get_running_partition(void) { return &running; }

esp_err_t esp_ota_get_state_partition(const esp_partition_t *p, esp_ota_img_states_t *state)
{
    const char *s = getenv("COLIBRI_OTA_STATE");
    if (p != &running || s == NULL || *s == 0) return ESP_FAIL;
    *state = (esp_ota_img_states_t)atoi(s);
    return ESP_OK;
}

esp_err_t esp_ota_mark_app_valid_cancel_rollback(void)
{
    fprintf(stderr, "ota: marked valid\n");
    return ESP_OK;
}

esp_err_t esp_ota_mark_app_invalid_rollback_and_reboot(void)
{
    fflush(stdout);
    if (getenv("COLIBRI_OTA_NO_PREVIOUS")) return ESP_FAIL;
    fprintf(stderr, "ota: marked invalid, rebooting\n");
    exit(6);
}

void esp_restart(void) { fflush(stdout); exit(7); }

/* The main task's stack and the heaps: COLIBRI_STACK_LEFT bytes never used on the calling task's
 * stack (only NULL, the calling task, is asked for); the internal 8-bit heap is COLIBRI_HEAP_TOTAL
 * bytes, COLIBRI_HEAP_LEAST of them free at the least; any other heap is not the firmware's. */
static size_t env_size(const char *name) { return getenv(name) ? (size_t)strtoul(getenv(name), NULL, 10) : 0; }

UBaseType_t uxTaskGetStackHighWaterMark(TaskHandle_t task)
{
    if (task != NULL) { fprintf(stderr, "high-water mark of another task\n"); exit(8); }
    return (UBaseType_t)env_size("COLIBRI_STACK_LEFT");
}

size_t heap_caps_get_total_size(uint32_t caps)
{
    return caps == (MALLOC_CAP_INTERNAL | MALLOC_CAP_8BIT) ? env_size("COLIBRI_HEAP_TOTAL") : 0;
}

size_t heap_caps_get_minimum_free_size(uint32_t caps)
{
    return caps == (MALLOC_CAP_INTERNAL | MALLOC_CAP_8BIT) ? env_size("COLIBRI_HEAP_LEAST") : 0;
}

int main(void)
{
    app_main();
    return 5; /* app_main never returns */
}
"""


@pytest.fixture(scope="module")
def simulated(projects, tmp_path_factory):
    """The default model's project (BSP, runtime, app, generated sources) built for this machine
    against the simulated ESP-IDF."""
    p = projects["kjv-tiny"]
    where = tmp_path_factory.mktemp("bsp-sim")
    for name, text in STUB_HEADERS.items():
        (where / "include" / name).parent.mkdir(parents=True, exist_ok=True)
        (where / "include" / name).write_text("#pragma once\n" + text)
    (where / "stubs.c").write_text(STUB_C)
    # idf.py's sdkconfig.h, from the project's sdkconfig.defaults: the values the stubs read
    config = parse_sdkconfig(p.text("sdkconfig.defaults"))
    (where / "include" / "sdkconfig.h").write_text(
        "#pragma once\n" + "".join(f"#define CONFIG_{k} {v}\n" for k, v in config.items() if v.isdigit())
    )
    main = p.root / "main"
    sources = sorted(main.rglob("*.c")) + [where / "stubs.c"]
    exe = gcc(
        where / "firmware",
        "-ffp-contract=off",
        "-fno-fast-math",
        "-I",
        where / "include",
        "-I",
        main / "colibri/generated",
        *sources,
        "-lm",
    )
    return p, exe


def run_simulated(
    exe: Path, partition: bytes | None, stdin: bytes, tmp_path: Path, label="weights", silent_reads=0, margins=None
):
    """`margins`: what the simulated FreeRTOS and heaps say (COLIBRI_STACK_LEFT, COLIBRI_HEAP_TOTAL,
    COLIBRI_HEAP_LEAST), as a dict of those names."""
    part = tmp_path / "partition.bin"
    if partition is not None:
        part.write_bytes(partition)
    env = dict(os.environ, COLIBRI_PARTITION=str(part), COLIBRI_LABEL=label, COLIBRI_SILENT_READS=str(silent_reads))
    env |= {name: str(value) for name, value in (margins or {}).items()}
    done = subprocess.run([str(exe)], input=stdin, capture_output=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    reader = FrameReader()
    frames = reader.feed(done.stdout)
    assert reader.rejected == 0
    # The board acknowledges every 64 bytes of a line it reads (flow control for the UART): the
    # tests look at the other frames.
    return [f for f in frames if f.kind != "ack"]


def acks_in(exe: Path, partition: bytes, stdin: bytes, tmp_path: Path) -> list[int]:
    env = dict(
        os.environ, COLIBRI_PARTITION=str(tmp_path / "partition.bin"), COLIBRI_LABEL="weights", COLIBRI_SILENT_READS="0"
    )
    (tmp_path / "partition.bin").write_bytes(partition)
    done = subprocess.run([str(exe)], input=stdin, capture_output=True, env=env, timeout=120)
    return [f.int("bytes") for f in FrameReader().feed(done.stdout) if f.kind == "ack"]


def request_line(prompt, steps, seed=0) -> bytes:
    s = SamplingParams(seed=seed).as_f32()
    return encode_request(0, prompt, steps, s.temperature, s.top_k, s.top_p, s.min_p, s.seed, False)


def as_flash(image: bytes, size: int) -> bytes:
    """The partition as it sits in flash: the image, then erased bytes up to the partition's size."""
    return image + b"\xff" * (size - len(image))


def after_boot_selftest(frames, result="pass"):
    """The frames with the boot self-test's (the board file's [selftest] boot = true), checked, left out."""
    assert frames[1].kind == "selftest" and frames[1].fields.get("result") == result, frames[:2]
    return frames[:1] + frames[2:]


def test_bsp_loads_the_image_from_its_partition_and_decodes_what_the_reference_decodes(simulated, tmp_path):
    p, exe = simulated
    image = (p.root / "weights.bin").read_bytes()
    partition = as_flash(image, align_up(len(image), 0x10000))  # larger than the image, as in flash
    prompt, steps = [1, 17, 42, 99], 6
    frames = after_boot_selftest(
        run_simulated(exe, partition, b"noise from a terminal\n" + request_line(prompt, steps), tmp_path)
    )
    kinds = [f.kind for f in frames]
    assert kinds == ["hello"] + ["token"] * steps + ["stats", "done"], kinds
    assert frames[0].fields["board"] == BOARD and frames[0].fields["model"] == p.generated.model_hash.hex()
    ref = Reference(p.plan, image).generate(prompt, steps, SamplingParams(), stop_at_eos=False)
    assert [f.int("id") for f in frames[1:-2]] == ref.tokens
    assert [f.fields["logits"] for f in frames[1:-2]] == ref.digests
    assert all(b.seq > a.seq for a, b in zip(frames, frames[1:]))


def test_bsp_reports_the_main_tasks_stack_and_the_internal_heap_in_its_stats_frame(simulated, tmp_path, board):
    """The margins come from FreeRTOS's and ESP-IDF's own counters (uxTaskGetStackHighWaterMark of the
    calling task, heap_caps_get_total_size / heap_caps_get_minimum_free_size of the internal 8-bit
    heap), against the main task's stack as ESP-IDF creates it; report and verify read them as any MCU's."""
    from generator.verify import Margins, planned_stack

    p, exe = simulated
    image = (p.root / "weights.bin").read_bytes()
    said = {"COLIBRI_STACK_LEFT": 5000, "COLIBRI_HEAP_TOTAL": 400_000, "COLIBRI_HEAP_LEAST": 380_000}
    frames = after_boot_selftest(run_simulated(exe, image, request_line([3, 4], 2), tmp_path, margins=said))
    [stats] = [f for f in frames if f.kind == "stats"]
    main_stack = board.idf.sdkconfig["ESP_MAIN_TASK_STACK_SIZE"] + 512  # ESP-IDF's TASK_EXTRA_STACK_SIZE
    margins = Margins.of(stats.fields)
    assert margins == Margins(stack_used=main_stack - 5000, stack_size=main_stack, heap_peak=20_000, heap_size=400_000)
    # the plan: the main task's stack the board file asks ESP-IDF for (the ELF idf.py links has no .stack)
    assert planned_stack(board, p.root / "no-elf-built-here") == board.idf.sdkconfig["ESP_MAIN_TASK_STACK_SIZE"]
    assert margins.warnings(planned_stack(board, None)) == []
    nearly_full = {"COLIBRI_STACK_LEFT": 600, "COLIBRI_HEAP_TOTAL": 400_000, "COLIBRI_HEAP_LEAST": 1000}
    frames = after_boot_selftest(run_simulated(exe, image, request_line([3, 4], 2), tmp_path, margins=nearly_full))
    tight = Margins.of(next(f for f in frames if f.kind == "stats").fields)
    assert [w.split(" B ")[0] for w in tight.warnings(planned_stack(board, None))] == [
        f"the firmware used {main_stack - 600:,}",
        "the firmware used 399,000",
    ]


# Where ESP-IDF (v5.x) declares what bsp_margins uses, and the component that header belongs to:
# components/freertos/FreeRTOS-Kernel/include/freertos/task.h, components/heap/include/esp_heap_caps.h,
# components/esp_system/include/esp_task.h.
MARGIN_API = {
    "uxTaskGetStackHighWaterMark": ("freertos/task.h", "freertos"),
    "heap_caps_get_total_size": ("esp_heap_caps.h", "heap"),
    "heap_caps_get_minimum_free_size": ("esp_heap_caps.h", "heap"),
    "MALLOC_CAP_INTERNAL": ("esp_heap_caps.h", "heap"),
    "MALLOC_CAP_8BIT": ("esp_heap_caps.h", "heap"),
    "ESP_TASK_MAIN_STACK": ("esp_task.h", "esp_system"),
}


def test_the_margins_use_esp_idfs_own_names_from_their_headers_and_components(projects):
    """The simulated ESP-IDF declares each name in the header ESP-IDF does; the BSP includes that
    header and the project requires its component, so idf.py finds them where this build did."""
    bsp = (REPO / "firmware_src/bsp/esp32p4-idf/main.c").read_text()
    margins = bsp[bsp.index("int bsp_margins(") :]
    margins = margins[: margins.index("\n}\n")]
    assert {name for name in MARGIN_API if re.search(rf"\b{name}\b", bsp)} == set(MARGIN_API)
    requires = set(cmake_block(projects["kjv-tiny"].text("main/CMakeLists.txt"), "REQUIRES"))
    for name, (header, component) in MARGIN_API.items():
        assert f'#include "{header}"' in bsp, f"{name} is declared in {header}"
        assert re.search(rf"\b{name}\b", STUB_HEADERS[header]), f"the simulated {header} lacks {name}"
        assert component in requires, f"{header} is in ESP-IDF's {component} component"
    assert "uxTaskGetStackHighWaterMark(NULL)" in margins  # the task running the decode: the caller


def test_bsp_acknowledges_every_64_bytes_of_a_request_line(simulated, tmp_path):
    p, exe = simulated
    image = (p.root / "weights.bin").read_bytes()
    line = request_line(list(range(1, 60)), 2)
    assert acks_in(exe, image, line, tmp_path) == [64 * (i + 1) for i in range((len(line) - 1) // 64)]


def test_bsp_serves_requests_one_after_another(simulated, tmp_path):
    p, exe = simulated
    image = (p.root / "weights.bin").read_bytes()
    frames = after_boot_selftest(
        run_simulated(exe, image, request_line([5, 6], 2) + request_line([7], 3, seed=9), tmp_path)
    )
    assert [f.kind for f in frames] == [
        "hello",
        "token",
        "token",
        "stats",
        "done",
        "token",
        "token",
        "token",
        "stats",
        "done",
    ]


def test_bsp_repeats_its_hello_while_idle_so_a_late_host_sees_one(simulated, tmp_path, board):
    p, exe = simulated
    assert board.idf.idle_hello_ms == 2000
    frames = after_boot_selftest(
        run_simulated(exe, (p.root / "weights.bin").read_bytes(), request_line([8], 1), tmp_path, silent_reads=5)
    )  # 5 s of silence: hellos at 2 s and 4 s
    assert [f.kind for f in frames] == ["hello", "hello", "hello", "token", "stats", "done"]
    assert frames[1].fields == frames[0].fields and frames[1].seq > 0  # not mistaken for a reset


@pytest.mark.parametrize(
    "case, code, words",
    [
        ("no partition", 1, "no weights partition"),
        ("truncated", 2, "truncated"),
        ("header only", 2, "truncated"),
        ("tiny", 2, "truncated"),
        ("other model", 13, "another model"),
    ],
)
def test_bsp_reports_a_bad_or_missing_partition_and_repeats_it_for_each_request(simulated, tmp_path, case, code, words):
    p, exe = simulated
    image = bytearray((p.root / "weights.bin").read_bytes())
    label = "weights"
    if case == "no partition":
        label, partition = "other", bytes(image)
    elif case == "truncated":
        partition = bytes(image[: len(image) // 2])
    elif case == "header only":
        partition = bytes(image[:128])
    elif case == "tiny":  # too small to hold a header: the length field is not even read
        partition = bytes(image[:100])
    else:  # a valid image of another model: same layout, other hash and a fixed CRC
        from damaged_images import header

        image = bytes(image)
        partition = header(image, "model_hash", bytes(b ^ 0xFF for b in read_header(image).model_hash))
    frames = after_boot_selftest(run_simulated(exe, partition, request_line([1, 2], 2), tmp_path, label), "fail")
    assert [f.kind for f in frames] == ["hello", "error", "error"]
    for f in frames[1:]:
        assert f.int("code") == code and words in f.fields["msg"].replace("%20", " ").lower()


def run_update_boot(exe: Path, partition: bytes, tmp_path: Path, state: int | None, no_previous=False):
    """The simulated board's boot as an app whose otadata state is `state` (None: no entry)."""
    (tmp_path / "partition.bin").write_bytes(partition)
    env = dict(os.environ, COLIBRI_PARTITION=str(tmp_path / "partition.bin"), COLIBRI_LABEL="weights")
    env["COLIBRI_OTA_STATE"] = "" if state is None else str(state)
    if no_previous:
        env["COLIBRI_OTA_NO_PREVIOUS"] = "1"
    done = subprocess.run([str(exe)], input=request_line([1], 1), capture_output=True, env=env, timeout=120)
    return done.returncode, [f for f in FrameReader().feed(done.stdout) if f.kind != "ack"], done.stderr.decode()


def test_an_updates_first_boot_confirms_the_app_when_its_self_test_passes(simulated, tmp_path):
    p, exe = simulated
    code, frames, log = run_update_boot(exe, (p.root / "weights.bin").read_bytes(), tmp_path, 1)  # PENDING_VERIFY
    assert code == 0 and "ota: marked valid" in log
    assert [f.kind for f in frames] == ["hello", "selftest", "token", "stats", "done"]
    assert frames[1].fields["result"] == "pass"
    for state in (None, 2):  # flashed over serial, or already confirmed: nothing to decide
        code, frames, log = run_update_boot(exe, (p.root / "weights.bin").read_bytes(), tmp_path, state)
        assert code == 0 and "ota:" not in log


def test_an_updates_first_boot_rolls_back_when_its_self_test_fails(simulated, tmp_path):
    p, exe = simulated
    image = bytearray((p.root / "weights.bin").read_bytes())
    image[-100] ^= 0x10  # a tensor's bytes: its CRC-32 no longer matches
    code, frames, log = run_update_boot(exe, bytes(image), tmp_path, 1)
    assert code == 6 and "ota: marked invalid, rebooting" in log  # esp_ota_mark_app_invalid_rollback_and_reboot
    assert [f.kind for f in frames] == ["hello", "selftest", "error"]
    assert frames[1].fields["result"] == "fail" and "previous app" in frames[2].fields["msg"].replace("%20", " ")
    # Nothing to go back to (the first update of a serial-flashed board): the app restarts, and the
    # bootloader aborts the unconfirmed app and starts ota_0.
    code, frames, log = run_update_boot(exe, bytes(image), tmp_path, 1, no_previous=True)
    assert code == 7 and [f.kind for f in frames] == ["hello", "selftest", "error"]


def test_bsp_refuses_an_overlong_or_corrupted_request_line_and_keeps_serving(simulated, tmp_path):
    p, exe = simulated
    image = (p.root / "weights.bin").read_bytes()
    overlong = b"@CLB 0 request prompt=" + b"1," * (p.plan.n_ctx * 12) + b"1 steps=1 *00000000\n"
    good = request_line([3, 4], 2)
    corrupted = good.replace(b"steps=2", b"steps=3")  # CRC no longer matches
    frames = after_boot_selftest(run_simulated(exe, image, overlong + corrupted + good, tmp_path))
    assert [f.kind for f in frames] == ["hello", "error", "error", "token", "token", "stats", "done"]
    assert "longer" in frames[1].fields["msg"] and "CRC mismatch" in frames[2].fields["msg"]
    assert frames[1].int("code") == frames[2].int("code") == 100


# ---- ESP-IDF itself ----


def test_without_esp_idf_find_idf_is_none_and_idf_build_says_so(projects, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("IDF_PATH", raising=False)
    assert find_idf() is None
    with pytest.raises(ColibriError) as e:
        idf_build(projects["kjv-tiny"].root)
    msg = str(e.value)
    assert "ESP-IDF not found" in msg and "export.sh" in msg and "\n" not in msg
    monkeypatch.setenv("IDF_PATH", str(tmp_path / "no-idf-here"))
    assert find_idf() is None
    with pytest.raises(ColibriError, match="not an ESP-IDF project"):
        idf_build(tmp_path)


def fake_idf(where: Path, body: str) -> Path:
    script = where / "idf.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(f"#!{sys.executable}\nimport sys, pathlib\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_idf_build_runs_idf_py_build_in_the_project(projects, tmp_path, monkeypatch):
    log = tmp_path / "args.txt"
    fake_idf(
        tmp_path / "bin",
        f"pathlib.Path({str(log)!r}).write_text(' '.join(sys.argv[1:]))\nprint('Project build complete.')",
    )
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv("IDF_PATH", raising=False)
    assert find_idf() == tmp_path / "bin" / "idf.py"
    lines = []
    idf_build(projects["kjv-tiny"].root, echo=lines.append)
    assert log.read_text() == f"-C {projects['kjv-tiny'].root} build"
    assert lines == ["Project build complete."]
    # Found through IDF_PATH when idf.py is not on PATH.
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    fake_idf(tmp_path / "esp-idf" / "tools", "print('ok')")
    monkeypatch.setenv("IDF_PATH", str(tmp_path / "esp-idf"))
    assert find_idf() == tmp_path / "esp-idf" / "tools" / "idf.py"


def test_a_failing_idf_build_is_one_clear_line(projects, tmp_path, monkeypatch):
    fake_idf(
        tmp_path / "bin",
        "print('-- Building ESP-IDF components for target esp32p4')\n"
        "print('colibri/app/decode.c:12:5: error: unknown type name foo')\nprint('ninja: build stopped')\n"
        "sys.exit(2)",
    )
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(ColibriError) as e:
        idf_build(projects["kjv-tiny"].root)
    msg = str(e.value)
    assert "idf.py build failed" in msg and "exit 2" in msg and "unknown type name foo" in msg and "\n" not in msg


def test_the_partition_table_keeps_gen_esp32parts_rules_for_ota(board):
    from generator.compile.esp32.partitions import Partition, check_partitions

    parts = idf_project.partition_table(board.idf, 1000)
    check_partitions(parts, 0x8000, 16 << 20)
    otadata = next(p for p in parts if p.subtype == "ota")
    with pytest.raises(ColibriError, match="otadata partition must be 0x2000 bytes"):
        check_partitions([dataclasses.replace(otadata, size=0x1000)] + parts[2:], 0x8000, 16 << 20)
    with pytest.raises(ColibriError, match="more than one otadata"):
        check_partitions(parts + [Partition("otadata2", "data", "ota", 0xF00000, 0x2000)], 0x8000, 16 << 20)
    with pytest.raises(ColibriError, match="unique"):
        check_partitions(parts + [Partition("ota_0", "app", "ota_2", 0xF00000, 0x10000)], 0x8000, 16 << 20)
