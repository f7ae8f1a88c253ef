"""PlainFigures: the --json document of a bench figure that is its fields as they are (asdict,
nested figures included), written once for all of them."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


class PlainFigures:
    """A base for frozen dataclasses whose to_json() is their fields, in their order."""

    def to_json(self) -> dict[str, object]:
        return asdict(cast("DataclassInstance", self))
