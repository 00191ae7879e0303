"""The pieces the files storage streams through: lines read a chunk at a time, and an
iterable of chunks read as a stream that stops at a size limit."""

from __future__ import annotations

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.batches.storage import ChunksReader, iter_lines


@given(st.binary(max_size=300), st.integers(min_value=1, max_value=40))
def test_lines_read_a_chunk_at_a_time_are_a_binary_file_s_lines(content, chunk_size):
    content = content.replace(b"\x00", b"\n")  # plenty of line ends
    assert list(iter_lines(io.BytesIO(content), chunk_size)) == list(io.BytesIO(content))


def test_a_stream_of_chunks_reads_them_in_order_and_counts_them():
    reader = ChunksReader([b"ab", b"", b"cde"], limit=5, too_large=AssertionError)
    assert io.BufferedReader(reader, 2).read() == b"abcde"
    assert reader.size == 5


def test_a_stream_of_chunks_raises_past_its_limit():
    class TooLarge(Exception):
        pass

    reader = ChunksReader([b"ab", b"cd"], limit=3, too_large=TooLarge)
    with pytest.raises(TooLarge):
        io.BufferedReader(reader).read()
