"""tracemem/fastjson.loads gives what json.loads gives, value and type, including where orjson alone would not."""
from __future__ import annotations

import json
import math

import pytest

from tracemem.fastjson import loads

SAME = ['{"when": "<lambda>"}', '1', '-0', '-0.0', '0.1', '1E5', '1e308', '"\\u00e9t\\u00e9"', '[1, 2.5, null, true]',
        '{"a": 1, "a": 2}', '9223372036854775807', '18446744073709551615', '123456789012345678901234567890',
        '-9223372036854775809', '{"id": 12345678901234567890123}', '12345678901234567890.5', '"\\ud83d"',
        '{"x": "abc 1234567890123456789 def"}', '1e400', '[]', '{}', '""']


@pytest.mark.parametrize("text", SAME)
def test_same_value_and_type_as_json(text: str) -> None:
    got, want = loads(text), json.loads(text)
    assert got == want and type(got) is type(want)
    assert json.dumps(got) == json.dumps(want)  # nested ints stay ints, floats stay floats


def test_nan_and_infinity_as_json_reads_them() -> None:
    assert math.isnan(loads("NaN")) and loads("[Infinity, -Infinity]") == [math.inf, -math.inf]


@pytest.mark.parametrize("text", ["", "{", "[1,]", "nul", '"a\x01b"'])
def test_invalid_text_raises_json_error(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        loads(text)
