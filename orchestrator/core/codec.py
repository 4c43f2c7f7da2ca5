"""Records' JSON derived from their types: one pydantic ``TypeAdapter`` per record type.

A record (a frozen dataclass, or a pydantic model) is written by :func:`dump` and read back by :func:`load`;
pydantic derives both from the record's declared fields, so a field added to a record is in its JSON at once,
both ways. Where a record's JSON is not simply its fields, the record says so on its own declaration:

* a key named otherwise than its field: ``Annotated[T, Field(alias="key")]``;
* a field the JSON does not carry (a location in this process's snapshot, soft state):
  ``Annotated[T, left_out(default)]``, read back as ``default``;
* a computed value the JSON carries: ``@computed_field`` on the property;
* a reason shown as ``reason`` (its text) and ``cause`` (its code) after the other keys: the
  :class:`~orchestrator.core.reasons.ReasonFields` base;
* a record whose JSON keeps a hand-written shape (keys out of field order, values computed from several
  fields): :func:`by_hand` on the class, so that records derived around it nest its ``to_json``;
* a record that takes no coercion (``"80"`` for a port): ``__pydantic_config__ = ConfigDict(strict=True)``.

Invariants:

* ``load(type(r), dump(r)) == r`` for every record whose fields all go into its JSON (the others come back
  with their left-out fields at the defaults ``left_out`` names);
* JSON keys come in field order (the computed ones after the fields, a ``ReasonFields`` reason last):
  what was persisted or sent keeps its bytes when a codec moves here (``tests/unit/test_codecs_compat.py``);
* every failure to read is an :class:`~orchestrator.core.errors.InvalidRequestError` naming the key as a
  dotted path under the caller's ``field`` (:func:`~orchestrator.core.validation.typed_error`); extra keys
  are ignored, so a record written by a newer head reads back;
* one adapter per type, built on its first use and kept (building one walks the type's fields; using it
  does not).
"""

from __future__ import annotations

import functools
from typing import Any, TypeVar

from pydantic import Field, TypeAdapter, ValidationError
from pydantic_core import core_schema

from orchestrator.core.validation import typed_error

T = TypeVar("T")

#: The validation alias of a left-out field: no JSON carries this key, so a key of the field's own name (another
#: field's alias, as ``node`` is for an allocation) never lands in it.
_NO_KEY = "\x00left out"


@functools.cache
def adapter(tp: Any) -> TypeAdapter[Any]:
    """The adapter of ``tp``, built once."""
    return TypeAdapter(tp)


def dump(value: Any) -> Any:
    """``value``'s JSON form (plain dicts, lists, strings, numbers), keys by their aliases."""
    # The adapter's serializer itself: ``dump_python``'s own checks cost more than writing a small record.
    return adapter(type(value)).serializer.to_python(value, mode="json", by_alias=True)


def load(tp: type[T], data: Any, field: str) -> T:
    """A ``tp`` read from its JSON form; :class:`~orchestrator.core.errors.InvalidRequestError` naming
    ``field`` + the offending key's path when ``data`` is not one."""
    try:
        return adapter(tp).validate_python(data)
    except ValidationError as e:
        raise typed_error(e, field) from None


def left_out(default: Any) -> Any:
    """Field metadata: the JSON does not carry this field; :func:`load` gives it ``default``."""
    return Field(default=default, exclude=True, validation_alias=_NO_KEY)


def by_hand(cls: type[T]) -> type[T]:
    """Class decorator: ``cls`` is written by its hand-written ``to_json``, inside derived records too; it is
    read as its fields say (key order and computed keys do not matter to a reader)."""

    def schema(_cls: Any, source: Any, handler: Any) -> core_schema.CoreSchema:
        s = handler(source)
        s["serialization"] = core_schema.plain_serializer_function_ser_schema(lambda v: v.to_json())
        return s

    cls.__get_pydantic_core_schema__ = classmethod(schema)  # type: ignore[attr-defined]
    return cls
