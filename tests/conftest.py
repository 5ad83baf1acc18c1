import pytest


@pytest.fixture
def root(tmp_path):
    """A real checkpoint root on a real filesystem (pytest's tmp dir)."""
    r = tmp_path / "root"
    r.mkdir()
    return r
