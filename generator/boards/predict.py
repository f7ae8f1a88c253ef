"""A board's timing model, its [predict] section: what bench predicts the board's decode speed
from, given exact instruction counts measured on an emulated stand-in (a board file's `predicts`
names the board whose model applies, e.g. qemu-rv32 predicts esp32p4-idf).

  [predict]
  clock_hz = 400_000_000          the core's clock
  cycles_per_instruction = 1.0    retired instructions per cycle, inverted
  weight_bytes_per_s = 84_000_000 how fast weights stream from where they are held

A token takes whichever is longer, the compute or the weight reads (they do not overlap on the P4).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TimingModel:
    clock_hz: float
    cycles_per_instruction: float
    weight_bytes_per_s: float

    def describe(self) -> str:
        return (
            f"{self.clock_hz / 1e6:.0f} MHz, {self.cycles_per_instruction} cycles/instruction, "
            f"weights at {self.weight_bytes_per_s / 1e6:.0f} MB/s, the slower of the two"
        )


def parse_predict(section: object) -> TimingModel:
    """The [predict] section; raises ValueError naming a wrong field."""
    if not isinstance(section, dict):
        raise TypeError("[predict] must be a table")
    values = {}
    for key in ("clock_hz", "cycles_per_instruction", "weight_bytes_per_s"):
        value = section[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"[predict] {key} must be a positive number, got {value!r}")
        values[key] = float(value)
    unknown = set(section) - set(values)
    if unknown:
        raise ValueError(f"[predict] has unknown fields {sorted(unknown)}")
    return TimingModel(**values)
