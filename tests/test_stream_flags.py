"""runtime.stream_flags without a GPU: what a stream may write or wait on."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ironlink.runtime import stream_flags  # noqa: E402


def test_a_stream_flag_is_one_8_byte_word() -> None:
    words = torch.zeros(4, dtype=torch.int64)
    assert stream_flags.word_address(words[2]) == words.data_ptr() + 16
    for bad in (words[:2], torch.zeros(1, dtype=torch.int32), torch.zeros(2, dtype=torch.int16)):
        with pytest.raises(ValueError, match="one 8-byte element"):
            stream_flags.word_address(bad)
