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
        ({"categorical_columns": [1], "missing_dense": float("nan")}, "missing_dense must be"),
        ({"categorical_columns": [1], "missing_dense": "0"}, "missing_dense must be"),
        ({"categorical_columns": [1], "missing_dense": True}, "missing_dense must be"),
        ({"categorical_columns": [1], "missing_categorical": "zero"}, "'empty'.*'error'.*'id:"),
        ({"categorical_columns": [1], "missing_categorical": None}, "missing_categorical must"),
        ({"categorical_columns": [1], "missing_categorical": "id:"}, "must be non-empty"),
        ({"categorical_columns": [1], "missing_categorical": "id:a,b"}, "non-empty field text"),
        (
            {
                "categorical_columns": [1],
                "multi_value_separator": "|",
                "missing_categorical": "id:a|b",
            },
            "give one category",
        ),
        (
            {
                "categorical_columns": [1],
                "categorical_encoding": "hex32",
                "missing_categorical": "id:xyz",
            },
            r"'xyz' is not a valid hex32 ID",
        ),
        (
            {
                "categorical_columns": [1],
                "categorical_encoding": "hex32",
                "missing_categorical": "id:1ffffffff",
            },
            "not a 32-bit hexadecimal ID",
        ),
        (
            {
                "categorical_columns": [1],
                "categorical_encoding": "int",
                "missing_categorical": "id:x",
            },
            r"'x' is not a valid int ID",
        ),
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


def test_missing_value_defaults_and_choices() -> None:
    fmt = DelimitedFormat(label_column=0, categorical_columns=[1])
    assert (fmt.missing_dense, fmt.missing_categorical, fmt.missing_token) == (0.0, "empty", None)
    chosen = DelimitedFormat(
        label_column=0,
        categorical_columns=[1],
        categorical_encoding="hex32",
        missing_dense=None,
        missing_categorical="id:0",
    )
    assert chosen.missing_dense is None and chosen.missing_token == "0"
    assert (
        DelimitedFormat(
            label_column=0, categorical_columns=[1], missing_categorical="error"
        ).missing_token
        is None
    )
