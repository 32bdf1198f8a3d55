"""The bytes under a folder's directory as the usage recount and the file API's deletes count them."""

from __future__ import annotations

import os
from pathlib import Path

from core.tree_bytes import tree_bytes


def test_regular_files_are_counted_and_no_symlink_is_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big.bin").write_bytes(b"x" * 10_000)
    root = tmp_path / "folder"
    (root / "a" / "b").mkdir(parents=True)
    (root / "top.txt").write_bytes(b"1234")
    (root / "a" / "b" / "deep.bin").write_bytes(b"y" * 300)
    (root / "a" / ".caravan-upload-x").write_bytes(b"z" * 5)  # a hidden file holds bytes too
    (root / "a" / "to-outside").symlink_to(outside)  # a session's link out counts nothing
    (root / "a" / "to-file").symlink_to(outside / "big.bin")
    os.mkfifo(root / "fifo")
    assert tree_bytes(root) == 4 + 300 + 5
    assert tree_bytes(root / "a" / "b" / "deep.bin") == 300
    assert tree_bytes(root / "a" / "to-file") == 0
    assert tree_bytes(root / "missing") == 0
