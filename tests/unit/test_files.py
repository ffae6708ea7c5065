"""One bounded read of a regular file: no FIFO blocks it, no device or huge file exhausts
memory, and a symlink is refused where the caller says so."""

from __future__ import annotations

import os

import pytest

from workbench.core.errors import WorkbenchError
from workbench.core.files import read_bounded


def test_a_regular_file_is_read_whole_up_to_its_limit(tmp_path):
    path = tmp_path / "a.json"
    path.write_bytes(b"x" * 10)
    assert read_bounded(path, 10, what="file") == b"x" * 10
    with pytest.raises(WorkbenchError, match="is larger than 9 bytes"):
        read_bounded(path, 9, what="file")


@pytest.mark.parametrize("kind", ["fifo", "folder", "device", "missing", "symlink"])
def test_anything_else_is_one_line_without_blocking(tmp_path, kind):
    path = tmp_path / "thing"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "device":
        path = "/dev/zero"
    elif kind == "symlink":
        (tmp_path / "target").write_bytes(b"{}")
        path.symlink_to(tmp_path / "target")
    with pytest.raises(WorkbenchError) as caught:
        read_bounded(path, 100, what="file", follow=False)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message
    assert ("No such file" in message) == (kind == "missing")
    assert ("symbolic link" in message) == (kind == "symlink")
    if kind == "symlink":  # followed where the caller allows it
        assert read_bounded(path, 100, what="file") == b"{}"
