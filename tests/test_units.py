import numpy as np
import pytest

from umctl.units import (BLOCK_SIZE, addr_to_block, block_range, format_bytes, page_to_block, pages_in,
                         parse_size)


@pytest.mark.parametrize("text, n", [("4096", 4096), ("1073741824", 1 << 30), ("512MiB", 512 << 20),
                                     ("512M", 512 << 20), ("1.5g", 3 << 29), ("8GiB", 8 << 30), ("2k", 2048),
                                     ("1 TiB", 1 << 40), (123, 123)])
def test_parse_size(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("bad", ["", "lots", "5 apples", "-1G"])
def test_parse_size_rejects(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


def test_block_helpers():
    assert addr_to_block(BLOCK_SIZE * 3 + 5) == 3
    assert np.array_equal(addr_to_block(np.array([0, BLOCK_SIZE], np.uint64)), [0, 1])
    assert page_to_block(512) == 1
    assert block_range(BLOCK_SIZE - 1, 2) == (0, 2)
    assert len(pages_in(4095, 2)) == 2
    assert format_bytes(1536) == "1.50 KiB"
