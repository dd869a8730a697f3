"""DelimitedFormat: every bad description is refused with the field and the fix."""

from __future__ import annotations

import pytest

from lightning_embark.data import DelimitedFormat
from lightning_embark.errors import ConfigError


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"categorical_columns": ["C1"]}, "has_header=True"),
        ({"categorical_columns": []}, "at least one"),
        ({"categorical_columns": [0]}, "more than once"),
        ({"categorical_columns": [1], "categorical_encoding": "md5"}, "categorical_encoding"),
        ({"categorical_columns": [1], "dense_transform": "log"}, "dense_transform"),
        ({"categorical_columns": [1], "encoding": "klingon"}, "encoding"),
        ({"categorical_columns": [1], "delimiter": ""}, "delimiter"),
        ({"categorical_columns": [1], "multi_value_separator": ","}, "multi_value_separator"),
        ({"categorical_columns": [1, 2], "feature_names": ["a"]}, "one name per"),
        ({"categorical_columns": [5], "num_columns": 3}, "num_columns"),
        ({"categorical_columns": [-1]}, ">= 0"),
    ],
)
def test_format_validation_names_the_problem(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        DelimitedFormat(label_column=0, **kwargs)


def test_a_format_by_names_needs_a_header_and_one_by_index_does_not() -> None:
    by_index = DelimitedFormat(label_column=0, categorical_columns=[1, 2])
    assert not by_index.has_header
    named = DelimitedFormat(has_header=True, label_column="y", categorical_columns=["a"])
    assert named.label_column == "y"
