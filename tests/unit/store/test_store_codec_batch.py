"""`decode_chunks`, many chunks of one part decoded at once, gives what `decode_chunk` gives each of them."""

from __future__ import annotations

import numpy as np
import pytest

from gpuwm.store.codec import MISSING, PARTS, SPLIT_PARTS, decode_chunk, decode_chunks, encode_chunks


@pytest.mark.parametrize("part", SPLIT_PARTS)
@pytest.mark.parametrize("points", [1, 12, 240])
def test_the_batch_decoder_is_the_plain_one(part: int, points: int) -> None:
    rng = np.random.default_rng(part * 1000 + points)
    width = len(PARTS[part])
    values = rng.integers(-10**12, 10**12, size=(9, width, points)) // rng.choice([1, 1000, 10**9], size=(9, width, 1))
    values = np.cumsum(values, axis=2)
    values[rng.uniform(size=values.shape) < 0.2] = MISSING
    values[3] = MISSING  # a series without any point of the part
    values[4, :, : points // 2] = MISSING  # one that begins inside the chunk
    values[5] = 7  # a constant: planes left out
    encoded = encode_chunks(values, part=part)
    batch = decode_chunks(encoded, points, part)
    for index, data in enumerate(encoded):
        assert np.array_equal(batch[index], decode_chunk(data, points, part=part)), index
        assert np.array_equal(batch[index], values[index]), index
