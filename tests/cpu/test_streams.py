"""runtime.streams' flags without a GPU: what a stream may write or wait on."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ironlink.runtime import streams


@dataclass
class Word:
    """What streams' flags read of a tensor."""

    count: int
    size: int
    ptr: int = 0x1000

    def numel(self) -> int:
        return self.count

    def element_size(self) -> int:
        return self.size

    def data_ptr(self) -> int:
        return self.ptr


def test_a_stream_flag_is_one_8_byte_word() -> None:
    assert streams.word_address(Word(1, 8, 0x2010)) == 0x2010
    for bad in (Word(2, 8), Word(1, 4), Word(4, 2), Word(0, 8)):
        with pytest.raises(ValueError, match="one 8-byte element"):
            streams.word_address(bad)
