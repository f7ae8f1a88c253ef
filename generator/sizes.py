"""Sizes and memory budgets as a user writes them (--memory-budget, a board file's memory_budget):
parsed and shown here, on the ground floor, below every stage that reads them (the board file in
boards/, the cache plan, the CLI).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# What --memory-budget auto leaves of the memory it finds. The plan already counts the resident part
# of the image (mapped and locked), the arenas and the board's budget_reserve (code, C library,
# stacks); this is for what the kernel charges the process besides: page tables (8 B per 4 KiB page,
# 1/512 of what the budget touches: 64 MiB for a 32 GiB budget), kernel stacks and slab, a buffered
# expert read's pages before they are dropped again, and, from MemAvailable, the rest of the
# system's growth while the firmware's pages are locked. bsp/linux/memory_limit.h says the same.
AUTO_MARGIN_BYTES = 128 * 2**20

_UNITS = {
    "": 1,
    "B": 1,
    "K": 2**10,
    "KB": 2**10,
    "KIB": 2**10,
    "M": 2**20,
    "MB": 2**20,
    "MIB": 2**20,
    "G": 2**30,
    "GB": 2**30,
    "GIB": 2**30,
    "T": 2**40,
    "TB": 2**40,
    "TIB": 2**40,
}


def parse_size(text: str) -> int:
    """A size: plain bytes, or a number with K, M, G or T (binary: 512M = 512 MiB; KB/KiB alike);
    0 (or "unlimited") means no budget. Raises ValueError with the reason."""
    s = str(text).strip().upper().replace("_", "")
    if s in ("UNLIMITED", "NONE"):
        return 0
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([A-Z]*)", s)
    if not m or m.group(2) not in _UNITS:
        raise ValueError(f"expected a size such as 512M, 6G or a number of bytes (0: unlimited), got {text!r}")
    value = float(m.group(1)) * _UNITS[m.group(2)] if "." in m.group(1) else int(m.group(1)) * _UNITS[m.group(2)]
    return int(value)


@dataclass(frozen=True)
class AutoBudget:
    """--memory-budget auto[-MARGIN]: the memory the firmware finds where it runs, less `margin`."""

    margin: int = AUTO_MARGIN_BYTES

    def firmware_option(self) -> str:
        """The Linux firmware's --memory-budget value (bsp/linux/options.c): the margin in bytes."""
        return f"auto-{self.margin}"

    def __str__(self) -> str:
        if self.margin == AUTO_MARGIN_BYTES:
            return "auto"
        unit = next((u for u in ("T", "G", "M", "K") if self.margin and self.margin % _UNITS[u] == 0), "")
        return f"auto-{self.margin // _UNITS[unit]}{unit}"


def parse_budget(text: str) -> int | AutoBudget:
    """--memory-budget: a size (parse_size), auto, or auto-MARGIN (auto-512M: that margin instead of
    AUTO_MARGIN_BYTES). Raises ValueError with the reason."""
    s = str(text).strip()
    m = re.fullmatch(r"auto(?:-(.*))?", s, re.IGNORECASE)
    if not m:
        try:
            return parse_size(s)
        except ValueError:
            raise ValueError(
                f"expected a size such as 512M, 6G or a number of bytes (0: unlimited), or auto "
                f"(auto-256M: a margin of 256M instead of {format_size(AUTO_MARGIN_BYTES)}), got {text!r}"
            ) from None
    if m.group(1) is None:
        return AutoBudget()
    try:
        if not m.group(1)[:1].isdigit():
            raise ValueError(m.group(1))
        return AutoBudget(parse_size(m.group(1)))
    except ValueError:
        raise ValueError(f"auto-MARGIN takes a margin such as auto-256M or auto-0, got {text!r}") from None


def format_size(n: int) -> str:
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    if n >= 2**20:
        return f"{n / 2**20:.1f} MiB"
    return f"{n:,} B"
