"""The one pydantic-error translator: typed_error, and config_error for config files."""

from __future__ import annotations

from typing import Annotated

import pytest
from pydantic import BaseModel, Field, ValidationError

from orchestrator.core.errors import ConfigError
from orchestrator.core.validation import config_error, typed_error


class _Pool(BaseModel):
    gpus: Annotated[int, Field(ge=0, le=64)] = 0


class _Doc(BaseModel):
    pools: list[_Pool] = []


def _error(data: object) -> ValidationError:
    with pytest.raises(ValidationError) as ei:
        _Doc.model_validate(data)
    return ei.value


def test_config_error_names_the_source_and_the_fields_path_in_our_words() -> None:
    e = config_error(_error({"pools": [{"gpus": 65}]}), _Doc, "pools.yaml")
    assert isinstance(e, ConfigError)
    assert (e.field, e.value, e.allowed) == ("pools.yaml:pools.0.gpus", 65, "an integer from 0 to 64")
    assert "Input should" not in str(e)
    assert typed_error(_error({"pools": [{"gpus": 65}]}), "doc", _Doc).field == "doc.pools.0.gpus"


def test_config_error_for_the_whole_document_says_so() -> None:
    e = config_error(_error([1]), _Doc, "pools.yaml")
    assert (e.field, e.allowed) == ("pools.yaml:(document)", "a mapping of fields")
