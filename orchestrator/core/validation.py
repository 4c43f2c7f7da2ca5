"""Pydantic's validation errors in our own words: one translation for every model of the project.

A pydantic model validates on construction; what it raises is a
``ValidationError`` worded by pydantic ("Input should be less than or equal
to 64"). Everything that leaves this package is one of our typed errors
instead (:class:`~orchestrator.core.errors.InvalidRequestError`, or
:class:`~orchestrator.core.errors.ConfigError` for config files), naming the
field as a dotted path and saying what is allowed, in words we chose.

:func:`typed_error` is that translation. Its rules:

* an error our own validator raised (pydantic wraps it) comes back as it was;
  its field is made a path from where pydantic located it when it is not one
  already (``job.gpu`` + ``isolation``);
* any other error names the field's dotted location (list positions
  included) and says what is allowed from the field's declared constraints
  (``an integer from 0 to 64``) or, failing that, from the kind of error;
* no text of pydantic's own is ever copied into the message (a test fuzzes
  the models and checks).

Invariant: a pure function of the error and the model class; it never raises.
"""

from __future__ import annotations

import math
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from orchestrator.core.errors import ConfigError, InvalidRequestError

#: What a value of each pydantic error type should have been, in our words: (detail, allowed).
_BY_TYPE: dict[str, tuple[str, str]] = {
    "missing": ("required", "a value"),
    "extra_forbidden": ("no such field", "the documented fields"),
    "int_type": ("not an integer", "an integer"),
    "int_parsing": ("not an integer", "an integer"),
    "int_from_float": ("not a whole number", "an integer"),
    "int_parsing_size": ("too large", "an integer of at most 19 digits"),
    "float_type": ("not a number", "a number"),
    "float_parsing": ("not a number", "a number"),
    "finite_number": ("not a finite number", "a finite number"),
    "bool_type": ("not true or false", "true or false"),
    "bool_parsing": ("not true or false", "true or false"),
    "string_type": ("not a string", "a string"),
    "string_unicode": ("not valid text", "a string"),
    "string_sub_type": ("not a plain string", "a string"),
    "dict_type": ("not a mapping", "a mapping"),
    "mapping_type": ("not a mapping", "a mapping"),
    "list_type": ("not a list", "a list"),
    "tuple_type": ("not a list", "a list"),
    "set_type": ("not a list", "a list of distinct items"),
    "frozen_set_type": ("not a list", "a list of distinct items"),
    "iterable_type": ("not a list", "a list"),
    "sequence_str": ("a string where a list belongs", "a list of strings"),
    "model_type": ("not a mapping of fields", "a mapping of fields"),
    "model_attributes_type": ("not a mapping of fields", "a mapping of fields"),
    "dataclass_type": ("not a mapping of fields", "a mapping of fields"),
    "none_required": ("must be empty", "null"),
    "is_instance_of": ("not of the expected kind", "a value of the documented type"),
    "callable_type": ("not of the expected kind", "a value of the documented type"),
    "url_parsing": ("not a URL", "a URL"),
    "uuid_parsing": ("not a UUID", "a UUID"),
    "recursion_loop": ("nested too deeply", "a value without cycles"),
    "frozen_instance": ("cannot be changed", "an unchanged value"),
}


def typed_error(e: ValidationError, prefix: str, model: type[BaseModel] | None = None,
                error_cls: type[InvalidRequestError] = InvalidRequestError) -> InvalidRequestError:
    """The first error of ``e`` as ``error_cls`` naming the field (``prefix`` + pydantic's location).

    ``model`` is the class that was validated: where given, the field's declared
    constraints say what is allowed, and an unknown field is answered with the
    known ones."""
    errs = e.errors(include_url=False)
    if not errs:
        return error_cls(prefix, None, "a valid value")
    err = errs[0]
    loc = tuple(err.get("loc", ()))
    inner = (err.get("ctx") or {}).get("error")
    if isinstance(inner, InvalidRequestError):
        return _rehomed(inner, prefix, loc, error_cls)
    path = _path(prefix, loc)
    kind = err.get("type", "")
    value = None if kind == "missing" else err.get("input")
    detail, allowed = _BY_TYPE.get(kind, ("not a valid value", "a value of the documented type"))
    ctx = err.get("ctx") or {}
    info = _field_info(model, loc)
    if kind == "extra_forbidden":
        parent = _model_at(model, loc[:-1])
        if parent is not None:
            allowed = ", ".join(parent.model_fields)
        return error_cls(path, _shown(value), f"one of the fields {allowed}" if parent is not None else allowed,
                         detail="no such field")
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        detail = {"greater_than": "at or below the minimum", "greater_than_equal": "below the minimum",
                  "less_than": "at or above the maximum", "less_than_equal": "above the maximum"}[kind]
        allowed = _bounds_text(info, ctx)
    elif kind in ("string_too_short", "string_too_long", "too_short", "too_long"):
        unit = "characters" if kind.startswith("string") else "items"
        detail = "too short" if kind.endswith("short") else "too long"
        lo, hi = ctx.get("min_length"), ctx.get("max_length")
        allowed = f"at least {lo} {unit}" if kind.endswith("short") else f"at most {hi} {unit}"
    elif kind == "string_pattern_mismatch":
        detail, allowed = "has characters or a form not allowed", f"text matching {ctx.get('pattern', '')}"
    elif kind in ("enum", "literal_error"):
        detail, allowed = "not one of the choices", _choices(ctx.get("expected", ""))
    elif kind in ("value_error", "assertion_error"):
        # A plain ValueError from one of our validators: its text is ours.
        detail = str(inner) if inner is not None else "not a valid value"
        allowed = "see the field's description"
    if info is not None and info.description and allowed in ("a value of the documented type",
                                                              "see the field's description"):
        allowed = info.description
    elif info is not None and kind in ("int_type", "int_parsing", "int_from_float", "float_type", "float_parsing",
                                       "finite_number") and _has_bounds(info):
        allowed = _bounds_text(info, ctx)
    return error_cls(path, _shown(value), allowed, detail=detail)


def config_error(e: ValidationError, model: type[BaseModel], source: str) -> ConfigError:
    """:func:`typed_error` for a config file: a :class:`ConfigError` whose field is ``source:field``
    (``configs/scheduler.yaml:priority_classes.0.value``), or ``source`` alone for the whole document."""
    t = typed_error(e, "", model, ConfigError)
    return ConfigError(f"{source}:{t.field}" if t.field else source, t.value, t.allowed, t.detail)


def _rehomed(inner: InvalidRequestError, prefix: str, loc: tuple[Any, ...],
             error_cls: type[InvalidRequestError]) -> InvalidRequestError:
    """Our own error, its field made a path from the validated model (``gpu.isolation`` for a
    ``JobSpec``'s request); a top-level model's own error keeps its field as raised."""
    parts = [str(x) for x in loc]
    if parts and parts[-1] == inner.field.split(".", 1)[0]:
        parts = parts[:-1]  # a field validator's error already names its field
    err = InvalidRequestError(".".join([*parts, inner.field]), inner.value, inner.allowed, inner.detail) if parts else inner
    if isinstance(err, error_cls):
        return err
    return error_cls(err.field, err.value, err.allowed, detail=err.detail)


def _path(prefix: str, loc: tuple[Any, ...]) -> str:
    """``prefix.a.0.b``; an empty key shows as ``''`` so the path always names something."""
    parts = [prefix] if prefix else []
    parts += [str(x) if str(x) else "''" for x in loc]
    return ".".join(parts) or "(document)"


def _shown(value: Any) -> Any:
    """The offending value as the error keeps it: long texts and big containers cut, so a message stays a line."""
    if isinstance(value, str) and len(value) > 200:
        return value[:200] + "..."
    if isinstance(value, (dict, list, tuple, set)) and len(repr(value)) > 200:
        return f"{type(value).__name__} of {len(value)} items"
    return value


def _choices(expected: Any) -> str:
    return str(expected).replace("'", "")


def _unwrap(annotation: Any) -> list[Any]:
    """The classes an annotation may hold (``X | None`` -> [X]; ``tuple[X, ...]`` -> [X])."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin is None:
        return [annotation]
    out: list[Any] = []
    for a in typing.get_args(annotation):
        if a is not Ellipsis and a is not type(None):
            out.extend(_unwrap(a))
    return out


def _model_at(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class at ``loc`` inside ``model`` (list positions and mapping keys skipped), or None."""
    cur: Any = model
    for part in loc:
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)):
            return None
        f = cur.model_fields.get(str(part))
        if f is None:
            continue  # a list position or mapping key: stay on the item's model
        models = [a for a in _unwrap(f.annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        if not models:
            return None
        cur = models[0]
    return cur if isinstance(cur, type) and issubclass(cur, BaseModel) else None


def _field_info(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> Any:
    if not loc:
        return None
    parent = _model_at(model, loc[:-1])
    return None if parent is None else parent.model_fields.get(str(loc[-1]))


def _has_bounds(info: Any) -> bool:
    return any(hasattr(m, a) for m in info.metadata for a in ("ge", "gt", "le", "lt"))


def _bounds_text(info: Any, ctx: dict[str, Any]) -> str:
    """``an integer from 0 to 64``, ``a number above 0, at most 1``: the field's declared range."""
    b: dict[str, Any] = {k: v for k, v in ctx.items() if k in ("ge", "gt", "le", "lt")}
    is_int = False
    if info is not None:
        for m in info.metadata:
            for a in ("ge", "gt", "le", "lt"):
                if getattr(m, a, None) is not None:
                    b.setdefault(a, getattr(m, a))
        is_int = int in _unwrap(info.annotation) and float not in _unwrap(info.annotation)
    noun = "an integer" if is_int else "a number"
    lo = ("ge", b["ge"]) if "ge" in b else ("gt", b["gt"]) if "gt" in b else None
    hi = ("le", b["le"]) if "le" in b else ("lt", b["lt"]) if "lt" in b else None
    if lo and hi and lo[0] == "ge" and hi[0] == "le":
        return f"{noun} from {_num(lo[1])} to {_num(hi[1])}"
    parts = []
    if lo:
        parts.append(f"at least {_num(lo[1])}" if lo[0] == "ge" else f"above {_num(lo[1])}")
    if hi:
        parts.append(f"at most {_num(hi[1])}" if hi[0] == "le" else f"below {_num(hi[1])}")
    return f"{noun} " + ", ".join(parts) if parts else noun


def _num(x: Any) -> str:
    if isinstance(x, float) and math.isfinite(x) and x == int(x):
        return str(int(x))
    return str(x)
