"""JSON documents from dataclasses: the one way every --json output and every typed result's
to_json is made. A dataclass field appears under its own name with its value made JSON-able
(nested dataclasses as documents, paths as strings, tuples as lists); its metadata, from
json_field(), renames it, leaves it out (always, or when None), converts its value first, merges
a nested document's keys in its place (`flatten`: nothing when None), or has properties of the
object written right after it (`then`: a computed figure such as "ok" placed among the fields).
mypy reads any json_field() call as a default, so a field without a default followed by others
without one is written `field(metadata=json_meta(...))` instead."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, field, fields, is_dataclass
from pathlib import PurePath
from typing import Any

_META = "json"


def json_meta(
    *,
    key: str | None = None,
    skip: bool = False,
    omit_none: bool = False,
    convert: Callable[[Any], Any] | None = None,
    flatten: bool = False,
    then: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A dataclass field's metadata on how it appears in the document: under `key` (default: its
    name), not at all (`skip`), not when its value is None (`omit_none`), as `convert(value)`, as
    the keys of its own document merged in its place (`flatten`), followed by the properties named
    in `then`."""
    return {
        _META: {"key": key, "skip": skip, "omit_none": omit_none, "convert": convert, "flatten": flatten, "then": then}
    }


def json_field(default: Any = MISSING, **how: Any) -> Any:
    """A dataclass field, with its `default` if given, and how it appears in the document
    (json_meta's options)."""
    return field(default=default, metadata=json_meta(**how))


def as_json(value: Any) -> Any:
    """`value` made JSON-able: a result's own to_json(), a dataclass's document, a path's text."""
    to_json = getattr(value, "to_json", None)
    if callable(to_json) and not isinstance(value, type):
        return to_json()
    if is_dataclass(value) and not isinstance(value, type):
        return document(value)
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [as_json(v) for v in value]
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    return value


def document(obj: Any) -> dict[str, Any]:
    """The JSON document of a dataclass instance, its fields in order (see json_field)."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        meta = f.metadata.get(_META, {})
        if meta.get("skip"):
            continue
        value = getattr(obj, f.name)
        if meta.get("omit_none") and value is None:
            continue
        convert = meta.get("convert")
        if meta.get("flatten"):
            out.update(as_json(value) if value is not None else {})
        else:
            out[meta.get("key") or f.name] = convert(value) if convert is not None else as_json(value)
        for name in meta.get("then", ()):
            out[name] = as_json(getattr(obj, name))
    return out


class JsonDocument:
    """A dataclass whose to_json() is its document."""

    def to_json(self) -> dict[str, Any]:
        return document(self)
