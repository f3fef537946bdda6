"""units.parse_size: decimal units with B, binary units bare or with iB, and bad sizes."""
import pytest

from horizon_sim.errors import HorizonError
from horizon_sim.units import GiB, fmt_bytes, parse_size


@pytest.mark.parametrize("text, expected", [
    ("1TB", 10**12),
    ("1.5TB", 1_500_000_000_000),
    ("1024GiB", 2**40),
    ("512G", 512 * 2**30),
    ("512 GB", 512 * 10**9),
    ("64k", 64 * 1024),
    ("4096", 4096),
    (4096, 4096),
    (1.5e12, 1_500_000_000_000),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text, match", [
    ("12 potatoes", r"ram '12 potatoes' is not a size"),
    ("0", r"ram '0' must be greater than zero"),
    ("-5G", r"ram '-5G' is not a size"),
    (0, r"ram 0 must be greater than zero"),
    ("", r"ram '' is not a size"),
    ("G", r"ram 'G' is not a size"),
])
def test_parse_size_rejects(text, match):
    with pytest.raises(HorizonError, match=match):
        parse_size(text, "ram")


def test_fmt_bytes():
    assert fmt_bytes(1.5 * 2**40) == "1.50 TiB"
    assert fmt_bytes(512 * 2**20) == "512.0 MiB"
    assert fmt_bytes(37.25 * GiB) == "37.2 GiB"
    assert fmt_bytes(12) == "12 B"
