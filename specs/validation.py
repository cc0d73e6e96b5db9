"""What model, plan and topology schemas share: the strict base class, bounded field types,
and the one translator of a pydantic error into a one-line InputError.

Wording, the same for every input file:  ``FILE: FIELD: VALUE: what is allowed``, where FIELD
is the dotted path the user wrote (dict keys and list indices included, pydantic's union tags
left out) and VALUE is a short prefix (at most ``VALUE_CHARS`` characters) of the offending
value, so a huge value can never make a huge message.
"""
from __future__ import annotations

import reprlib
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from costmodel.errors import InputError
from costmodel.limits import number_problem

VALUE_CHARS = 60

_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxdict, _repr.maxlist, _repr.maxtuple = 2, 4, 4, 4
_repr.maxstring, _repr.maxother, _repr.maxlong = VALUE_CHARS, VALUE_CHARS, VALUE_CHARS


def short(value: object) -> str:
    """repr of ``value``, at most VALUE_CHARS characters (bounded work for any size)."""
    text = _repr.repr(value)
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 3] + "..."


class Strict(BaseModel):
    """Frozen; an unknown key is an error that lists the keys allowed at that place."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data):
        if isinstance(data, dict):
            for key in data:
                if key not in cls.model_fields:
                    raise PydanticCustomError(
                        "unknown_key", "unknown field; allowed: {allowed}",
                        {"key": short(key) if not isinstance(key, str) else key[:VALUE_CHARS],
                         "allowed": ", ".join(cls.model_fields)})
        return data


def _number(lo: float, hi: float, integer: bool, lo_open: bool, hi_open: bool):
    def check(value):
        # --plan strings: "8" is 8, "8.0" or "true" are not; ASCII only (Python's int() and
        # float() also read other scripts' digits, as "\uff18" for 8)
        if integer and isinstance(value, str) and value.isascii():
            text = value.strip()
            if text.lstrip("+-").isdigit() and len(text) <= 12:
                value = int(text)
        elif not integer and isinstance(value, str) and value.isascii():
            try:
                value = float(value)
            except ValueError:
                pass
        problem = number_problem(value, lo, hi, integer=integer, lo_open=lo_open, hi_open=hi_open)
        if problem:
            raise PydanticCustomError("number_range", problem)
        return value
    return BeforeValidator(check)


def Int(lo: int, hi: int):
    """An integer in [lo, hi]: no booleans, no floats (not even 2.0 or 16e300)."""
    return Annotated[int, _number(lo, hi, True, False, False)]


def Float(lo: float, hi: float, lo_open: bool = False, hi_open: bool = False):
    """A finite number in the range (booleans refused)."""
    return Annotated[float, _number(lo, hi, False, lo_open, hi_open)]


def _bool(value):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):  # --plan strings
        return value.strip().lower() == "true"
    raise PydanticCustomError("bool_type", "must be true or false")


Bool = Annotated[bool, BeforeValidator(_bool)]


def input_error(err: ValidationError, source: str, doc=None) -> InputError:
    """The first error of a pydantic validation of ``doc`` as a one-line InputError."""
    e = err.errors()[0]
    loc = list(e.get("loc", ()))
    parts: list[str] = []
    for i, item in enumerate(loc):
        if item in ("[key]", "__root__"):  # a bad dict key: the key is already in loc
            continue
        if _is_union_tag(doc, loc, i):
            continue
        parts.append(str(item))
    field = ".".join(parts) or None
    kind, ctx = e.get("type"), e.get("ctx") or {}
    if kind == "unknown_key":
        return InputError(source, ".".join(parts + [str(ctx["key"])]), e["msg"])
    if kind == "extra_forbidden":
        return InputError(source, field, "unknown field")
    if kind == "missing":
        return InputError(source, field, "required field is missing")
    if kind in ("union_tag_not_found", "union_tag_invalid"):
        disc = str(ctx.get("discriminator", "kind")).strip("'")
        got = "missing" if kind == "union_tag_not_found" else short(ctx.get("tag"))
        return InputError(source, f"{field}.{disc}" if field else disc,
                          f"{got}; allowed: {ctx.get('expected_tags', '')}")
    msg = e.get("msg", "invalid value")
    for prefix, repl in (("Value error, ", ""), ("Input should be ", "must be ")):
        if msg.startswith(prefix):
            msg = repl + msg[len(prefix):]
    if "input" in e and kind != "value_error":
        return InputError(source, field, f"{short(e['input'])}: {msg}")
    return InputError(source, field, msg)


def _is_union_tag(doc, loc: list, i: int) -> bool:
    """Whether loc[i] is the tag pydantic inserts for a tagged-union member (users never
    write it): the ``kind`` value of the mapping one level up in the document."""
    item = loc[i]
    if not isinstance(item, str) or i == 0:
        return False
    cur = doc
    for part in loc[:i]:
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur):
            cur = cur[part]
        else:
            return False
    return isinstance(cur, dict) and cur.get("kind") == item and item not in cur


def validate(model_cls: type[BaseModel], data, source: str):
    """``model_cls`` validated from ``data`` (a mapping from YAML or a --plan string);
    InputError in the one wording above on any problem."""
    if not isinstance(data, dict):
        raise InputError(source, None, f"{short(data)}: expected a mapping of "
                                       f"{', '.join(model_cls.model_fields)}")
    try:
        return model_cls.model_validate(data)
    except ValidationError as err:
        raise input_error(err, source, data) from None
