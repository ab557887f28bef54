"""The plain listing layout: every column as wide as its widest cell, rows in order, nothing trailing."""

from __future__ import annotations

import pytest

from assay.terminal import plain_table


def test_columns_line_up_under_their_headers() -> None:
    text = plain_table(("user", "roles"), [("alice", "organiser, viewer"), ("bo", "")])
    assert text.splitlines() == [
        "user   roles",
        "-----  -----------------",
        "alice  organiser, viewer",
        "bo",
    ]


def test_no_rows_still_prints_the_header_and_a_ragged_row_is_an_error() -> None:
    assert plain_table(("a", "bb"), []) == "a  bb\n-  --"
    with pytest.raises(ValueError):
        plain_table(("a", "b"), [("only one",)])
