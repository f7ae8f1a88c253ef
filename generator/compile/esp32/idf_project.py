"""ESP-IDF project stage (board esp32p4-idf): the generated sources, the runtime and the BSP become a
complete, self-contained ESP-IDF project that `idf.py build` turns into the bootloader, the
partition table and the app, beside the weight image for its flash partition.

    project/
      CMakeLists.txt            project(colibri_fw); idf.py's entry
      sdkconfig.defaults        target, PSRAM (hex), CPU clock, -O2, watchdogs, flash, partition table
      partitions.csv            nvs, otadata and the A/B app slots (or a factory app), the weights partition
      weights.bin               the weight image (generated/weights.img), for the weights partition
      flash_args, README.txt    which file goes at which offset (esptool's @file syntax)
      main/CMakeLists.txt       idf_component_register: every source below, numerics flags
      main/colibri.lf           linker fragment: arenas in PSRAM, hot code in IRAM, RoPE tables in RAM
      main/colibri/...          copies of firmware_src/{runtime,app,bsp/<bsp>} and generated/

Every value is computed here from the board file ([flash], [idf]) and the plan; the templates in
templates/idf/ only loop and look up. Writes are atomic, the output has no timestamps and no
absolute paths, so the same inputs give the same bytes in any directory.
"""

from __future__ import annotations

from pathlib import Path

from ... import __version__
from ...boards import Board, FlashImage, IdfSettings, firmware_sources
from ...boards.esp_idf import FLASH_FREQS
from ...errors import ColibriError
from ...files import REPO, write_atomic
from ..emit import GENERATED_FILES, environment
from ..image import read_header
from ..layout import align_up
from ..pipeline import SELFTEST_CHECKS_FILE, SELFTEST_DATA_FILE, WEIGHTS_FILE
from ..plan import Plan
from .partitions import MMU_PAGE, Partition, check_partitions

TEMPLATE_DIR = REPO / "templates" / "idf"
COLIBRI_DIR = "main/colibri"  # inside the project: copies of firmware_src and the generated files

# templates/idf/<name>.j2 -> path in the project
TEMPLATES = {
    "CMakeLists.txt": "CMakeLists.txt",
    "main_CMakeLists.txt": "main/CMakeLists.txt",
    "colibri.lf": "main/colibri.lf",
    "colibri_idf.h": f"{COLIBRI_DIR}/generated/colibri_idf.h",
    "sdkconfig.defaults": "sdkconfig.defaults",
    "partitions.csv": "partitions.csv",
    "flash_args": "flash_args",
    "README.txt": "README.txt",
}
# ESP-IDF components the BSP uses (header -> component): esp_ota_ops.h, driver/uart.h, esp_partition.h,
# esp_timer.h, FreeRTOS, esp_heap_caps.h (heap), esp_task.h (esp_system); spi_flash provides the mmap
# types esp_partition.h uses.
REQUIRES = (
    "app_update",
    "esp_app_format",
    "esp_driver_uart",
    "esp_partition",
    "esp_system",
    "esp_timer",
    "freertos",
    "heap",
    "spi_flash",
)
# The numerics contract (docs/numerics.md), on top of ESP-IDF's own flags.
COMPILE_OPTIONS = ("-ffp-contract=off", "-fno-fast-math", "-fno-math-errno")
# Objects whose code runs for every weight: in IRAM, so streaming weights through the cache cannot
# evict them. (Their constants go to internal RAM with them: the `noflash` scheme.) Every file of the
# board's kernel sets joins them (kernel_objects).
HOT_OBJECTS = ("checksum", "model", "ops", "sampler")
KERNELS_DIR = f"{COLIBRI_DIR}/runtime/kernels/"


def partition_table(s: IdfSettings, image_bytes: int) -> list[Partition]:
    """nvs, the app (two or more OTA slots and otadata, or the factory app) and the weights
    partition (the image rounded up to 64 KiB)."""
    app, weights = s.images["app"], s.images["weights"]
    needed = align_up(max(image_bytes, 1), MMU_PAGE)
    if needed > weights.size:
        raise ColibriError(
            f"the weight image ({image_bytes:,} B) needs a {needed:,} B partition but the board's "
            f"weights partition can have at most {weights.size:,} B"
        )
    parts = [
        Partition("nvs", "data", "nvs", s.nvs_offset, s.nvs_size),
        *(
            [Partition("otadata", "data", "ota", s.images["otadata"].offset, s.images["otadata"].size)]
            + [Partition(f"ota_{i}", "app", f"ota_{i}", offset, app.size) for i, offset in enumerate(s.ota_slots)]
            if s.ota_slots
            else [Partition("factory", "app", "factory", app.offset, app.size)]
        ),
        Partition(s.weights_partition, "data", s.weights_subtype, weights.offset, needed, "readonly"),
    ]
    check_partitions(parts, s.images["partition-table"].offset, s.flash_bytes)
    return parts


def _kconfig_string(text: str) -> str:
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _sdkconfig_line(key: str, value) -> str:
    if value is True:
        return f"CONFIG_{key}=y"
    if value is False:
        return f"# CONFIG_{key} is not set"
    if isinstance(value, int):
        return f"CONFIG_{key}={value}"
    return f"CONFIG_{key}={_kconfig_string(value)}"


def sdkconfig_entries(s: IdfSettings) -> list[dict]:
    """Groups of (comment, lines) for sdkconfig.defaults: what follows from the board, then its extras."""
    rev_min = f"ESP32P4_REV_MIN_{s.min_revision}" if s.target == "esp32p4" else None
    derived = [
        (
            "Target and chip revisions",
            [("IDF_TARGET", s.target)]
            + ([("ESP32P4_SELECTS_REV_LESS_V3", s.rev_less_v3), (rev_min, True)] if rev_min else []),
        ),
        (f"CPU at {s.cpu_mhz} MHz", [(f"ESP_DEFAULT_CPU_FREQ_MHZ_{s.cpu_mhz}", True)]),
        (
            f"Flash: {s.flash_size}, {s.flash_mode.upper()}, {s.flash_freq}",
            [
                (f"ESPTOOLPY_FLASHMODE_{s.flash_mode.upper()}", True),
                (f"ESPTOOLPY_FLASHFREQ_{FLASH_FREQS[s.flash_freq]}", True),
                (f"ESPTOOLPY_FLASHSIZE_{s.flash_size}", True),
            ],
        ),
        (
            "Partition table: partitions.csv",
            [
                ("PARTITION_TABLE_CUSTOM", True),
                ("PARTITION_TABLE_CUSTOM_FILENAME", "partitions.csv"),
                ("PARTITION_TABLE_OFFSET", f"0x{s.images['partition-table'].offset:x}"),
            ],
        ),
        ("Requests and results on the console UART", [("ESP_CONSOLE_UART_BAUDRATE", s.uart_baud)]),
    ]
    if s.ota_slots:  # a new app boots pending and confirms itself or rolls back (bsp/esp32p4-idf, app/ota_state.c)
        derived.append(
            (f"A/B app slots (ota_0..ota_{len(s.ota_slots) - 1}): rollback", [("BOOTLOADER_APP_ROLLBACK_ENABLE", True)])
        )
    taken = {key for _, items in derived for key, _ in items}
    clash = sorted(taken & set(s.sdkconfig))
    if clash:
        raise ColibriError(f"[idf.sdkconfig] sets {', '.join(clash)}, which the board's [flash]/[idf] settings decide")
    groups = derived + [("Board settings ([idf.sdkconfig])", list(s.sdkconfig.items()))]
    out = []
    for comment, items in groups:
        lines = []
        for key, value in items:
            if key == "PARTITION_TABLE_OFFSET":  # a Kconfig hex value: unquoted
                lines.append(f"CONFIG_{key}={value}")
            else:
                lines.append(_sdkconfig_line(key, value))
        out.append(dict(comment=comment, lines=lines))
    return out


def project_sources(board: Board, repo: Path) -> list[tuple[Path, str]]:
    """(file in the repository, path in the project) for every hand-written file the project copies:
    the board's firmware sources (the ones the SConstruct compiles, and the BSP) and their headers."""
    src = repo / "firmware_src"
    c_files = [f for f in firmware_sources(board, repo) if f.suffix == ".c"]
    headers = sorted({h for f in c_files for h in f.parent.glob("*.h")})
    return [(f, f"{COLIBRI_DIR}/{f.relative_to(src).as_posix()}") for f in sorted(set(c_files) | set(headers))]


def kernel_objects(sources: list[str]) -> set[str]:
    """The objects of the kernel sets' C files among the project's sources (a set's folder holds
    several: kernels/<set>/*.c), named as ldgen names an object: by its file name alone, so a
    kernel file and a runtime file of the same name (attention.c) are placed together."""
    return {Path(p).stem for p in sources if p.startswith(KERNELS_DIR) and p.endswith(".c")}


def template_context(board: Board, plan: Plan, s: IdfSettings, model_hash: bytes, sources: list[str]) -> dict:
    parts = partition_table(s, plan.image.image_bytes)
    weights = next(p for p in parts if p.name == s.weights_partition)
    table = s.images["partition-table"]
    idf_build_dir = f"{s.project_dir}/build/"

    def in_project(image: FlashImage) -> str:
        """An image's path relative to the project (the board gives it relative to the build dir)."""
        if image.name == "weights":
            return "weights.bin"
        if not image.file.startswith(idf_build_dir):
            raise ColibriError(
                f"{board.path.name}: image {image.name} ({image.file}) is not an idf.py output under {idf_build_dir}"
            )
        return image.file[len(s.project_dir) + 1 :]

    if (
        s.images["app"].file != f"{idf_build_dir}{s.project_name}.bin"
        or s.images["weights"].file != f"{s.project_dir}/weights.bin"
    ):
        raise ColibriError(
            f"{board.path.name}: the app and weights images must be "
            f"{idf_build_dir}{s.project_name}.bin and {s.project_dir}/weights.bin"
        )
    flash_files = [
        dict(name=i.name, offset=f"0x{i.offset:x}", path=in_project(i))
        for i in sorted(s.images.values(), key=lambda i: i.offset)
    ]
    return dict(
        fw_version=__version__,
        board=board.name,
        description=board.description,
        model_name=plan.spec.name,
        architecture=plan.spec.architecture,
        quant=plan.quant,
        n_ctx=plan.n_ctx,
        model_hash_hex=model_hash.hex(),
        image_bytes=plan.image.image_bytes,
        idf=s,
        project_name=s.project_name,
        sources=[p[len("main/") :] for p in sources if p.endswith(".c")],
        include_dirs=["colibri/generated"],
        requires=sorted(REQUIRES),
        compile_options=list(COMPILE_OPTIONS),
        hot_objects=sorted(set(HOT_OBJECTS) | kernel_objects(sources)),
        partitions=[
            dict(
                name=p.name,
                type=p.type,
                subtype=p.subtype,
                offset=f"0x{p.offset:x}",
                size=f"0x{p.size:x}",
                flags=p.flags,
            )
            for p in parts
        ],
        weights_partition=dict(
            name=weights.name,
            offset=f"0x{weights.offset:x}",
            size=f"0x{weights.size:x}",
            subtype=f"0x{s.weights_subtype_value:02x}",
        ),
        partition_table_offset=f"0x{table.offset:x}",
        ota_slots=len(s.ota_slots),
        sdkconfig=sdkconfig_entries(s),
        flash_files=flash_files,
        flash_header=f"--flash-mode {s.flash_mode} --flash-freq {s.flash_freq} --flash-size {s.flash_size}",
        flash_baud=board.flash.baud,
        uart_rx_buffer=s.uart_rx_buffer,
        uart_num=s.uart_num,
        idle_hello_ms=s.idle_hello_ms,
    )


def write_project(board: Board, plan: Plan, generated_dir: Path, project_dir: Path, repo: Path) -> list[Path]:
    """Write the ESP-IDF project for `plan` (whose files pipeline.generate wrote to generated_dir)
    into project_dir; returns the files written, sorted. Files of an earlier project that this one
    no longer has are removed from main/; idf.py's own build/ and sdkconfig are left alone."""
    generated_dir, project_dir, repo = Path(generated_dir), Path(project_dir), Path(repo)
    if plan.board != board.name:
        raise ColibriError(f"the plan is for board {plan.board}, not {board.name}")
    s = board.idf
    if s is None:
        raise ColibriError(f"board {board.name} has no [flash] and [idf] sections: it is not an ESP-IDF board")
    missing = [
        n
        for n in (*GENERATED_FILES, WEIGHTS_FILE, SELFTEST_DATA_FILE, SELFTEST_CHECKS_FILE)
        if not (generated_dir / n).is_file()
    ]
    if missing:
        raise ColibriError(f"{generated_dir} lacks {', '.join(missing)}: generate the sources first")
    image = (generated_dir / WEIGHTS_FILE).read_bytes()
    header = read_header(image)
    if header.image_bytes != plan.image.image_bytes:
        raise ColibriError(
            f"{generated_dir / WEIGHTS_FILE} is {header.image_bytes:,} B but the plan says "
            f"{plan.image.image_bytes:,} B: regenerate"
        )

    if header.model_hash.hex() not in (generated_dir / "model_data.c").read_text(errors="replace"):
        raise ColibriError(f"{generated_dir}: weights.img and model_data.c are from different generations: regenerate")

    copies = project_sources(board, repo)
    copies += [
        (generated_dir / n, f"{COLIBRI_DIR}/generated/{n}")
        for n in sorted((*GENERATED_FILES, SELFTEST_DATA_FILE, SELFTEST_CHECKS_FILE))
    ]
    rel_paths = [rel for _, rel in copies] + [TEMPLATES["colibri_idf.h"]]
    context = template_context(board, plan, s, header.model_hash, sorted(rel_paths))

    outputs: dict[str, bytes] = {rel: path.read_bytes() for path, rel in copies}
    env = environment(TEMPLATE_DIR)
    for name, rel in TEMPLATES.items():
        outputs[rel] = env.get_template(name + ".j2").render(context).encode()
    outputs["weights.bin"] = image

    written = []
    for rel in sorted(outputs):
        target = project_dir / rel
        if not (target.is_file() and target.read_bytes() == outputs[rel]):
            write_atomic(target, outputs[rel])
        written.append(target)
    owned = project_dir / COLIBRI_DIR
    keep = {project_dir / rel for rel in outputs}
    for stale in sorted(p for p in owned.rglob("*") if p.is_file() and p not in keep):
        stale.unlink()
    return sorted(written)
