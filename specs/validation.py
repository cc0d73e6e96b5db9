"""Turn a pydantic ValidationError into (dotted field path, one-line message)."""
from __future__ import annotations

import typing

from pydantic import BaseModel, ValidationError


def first_error(err: ValidationError, model_cls: type[BaseModel] | None = None) -> tuple[str | None, str]:
    """The first error of a pydantic validation, as (field path, message with the value).

    For an unknown key, the message lists the keys allowed at that place when
    `model_cls` (the top-level model) is given.
    """
    e = err.errors()[0]
    loc = tuple(p for p in e.get("loc", ()) if p != "__root__")
    field = ".".join(str(p) for p in loc) or None
    msg = e.get("msg", "invalid value")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    kind = e.get("type")
    if kind == "extra_forbidden":
        parent = _model_at(model_cls, loc[:-1]) if model_cls else None
        msg = "unknown field" + (f"; allowed: {', '.join(parent.model_fields)}" if parent else "")
    elif kind == "missing":
        msg = "required field is missing"
    elif "input" in e and not isinstance(e["input"], (dict, list)) and "(got" not in msg:
        msg = f"{msg} (got {e['input']!r})"
    return field, msg


def _model_at(model_cls, loc) -> type[BaseModel] | None:
    """The pydantic model class reached by following `loc` from `model_cls`."""
    cur = model_cls
    for part in loc:
        if isinstance(part, int) or cur is None:
            continue  # list index: the element type was unwrapped already
        if isinstance(cur, type) and issubclass(cur, BaseModel):
            if part not in cur.model_fields:
                return None
            cur = _unwrap(cur.model_fields[part].annotation)
        else:
            cur = None
    return cur if isinstance(cur, type) and issubclass(cur, BaseModel) else None


def _unwrap(tp):
    """Optional[X], list[X], dict[str, X] -> X (the first BaseModel found)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    for arg in typing.get_args(tp):
        got = _unwrap(arg)
        if got is not None:
            return got
    return None
