"""The bench commands' comma-list option parsers (one definition for every command)."""

import pytest
from agentserve_bench.arg_types import floats, ints


def test_comma_lists_parse_and_skip_empty_items():
    assert ints("1,4,16") == [1, 4, 16] and ints("1,4,") == [1, 4]
    assert floats("0,0.7") == [0.0, 0.7]
    with pytest.raises(ValueError):
        ints("1,x")
