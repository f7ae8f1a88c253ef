"""Boards, on the ground floor: the typed board (memory regions, flash, ESP-IDF settings, timing
model) parsed from targets/<name>.toml when it loads, and the ways a board runs. Every stage may
import this package; it imports none of them."""

from .board import CATEGORIES, DEFAULT_KV_TYPE, KV_TYPES, Board, MemoryRegion
from .esp_idf import IdfSettings
from .flash import Flash, FlashImage
from .load import (
    TARGETS_DIR,
    available_boards,
    board_files,
    board_from_data,
    board_reference,
    load_board,
    read_board_file,
)
from .predict import TimingModel
from .runners import BuildOnlyRunner, EmulatedSystemRunner, MpiRunner, ProcessRunner, Runner, SerialRunner
from .sources import firmware_sources, kernel_set_sources

__all__ = [
    "CATEGORIES",
    "DEFAULT_KV_TYPE",
    "KV_TYPES",
    "TARGETS_DIR",
    "Board",
    "BuildOnlyRunner",
    "EmulatedSystemRunner",
    "Flash",
    "FlashImage",
    "IdfSettings",
    "MemoryRegion",
    "MpiRunner",
    "ProcessRunner",
    "Runner",
    "SerialRunner",
    "TimingModel",
    "available_boards",
    "board_files",
    "board_from_data",
    "board_reference",
    "firmware_sources",
    "kernel_set_sources",
    "load_board",
    "read_board_file",
]
