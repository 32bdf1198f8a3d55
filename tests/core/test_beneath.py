"""Files beneath a directory descriptor (``core.beneath``), on the real file system: no symlink is followed anywhere on
a path (in the middle, at the end, absolute or relative), no ``..`` leaves, a directory swapped for a link after it
was opened leads nowhere, and the walk, the tree removal and ``mkdir -p`` stay inside. Each test runs with
``openat2`` and again with the component walk used where the kernel lacks it (openat2 "missing" is the injected
fault: this kernel has it)."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from core import beneath
from core.tree_bytes import folder_bytes, tree_bytes

SECRET = b"root-only, outside the folder"


@pytest.fixture(params=["openat2", "component walk"], autouse=True)
def resolution(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    assert beneath.openat2_supported()  # this machine's kernel has it: the other way is forced
    if request.param == "component walk":
        monkeypatch.setattr(beneath, "_openat2_works", False)  # fault: a kernel without openat2
    return str(request.param)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    out = tmp_path / "outside"
    (out / "dir").mkdir(parents=True)
    (out / "secret").write_bytes(SECRET)
    (out / "secret").chmod(0o600)
    (out / "dir" / "x").write_bytes(b"outside x")
    return out


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "folder"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f.txt").write_bytes(b"inside")
    return root


@pytest.fixture
def root(folder: Path) -> Iterator[int]:
    with beneath.held(beneath.open_root(folder)) as fd:
        yield fd


def loops(call: object) -> None:
    """``call()`` refuses with ELOOP (a symlink on the way)."""
    with pytest.raises(OSError) as refused:
        call()  # type: ignore[operator]
    assert refused.value.errno == errno.ELOOP, refused.value


def read(root: int, *parts: str) -> bytes:
    with beneath.held(beneath.open_file(root, parts)) as fd:
        return os.read(fd, 1000)


def test_a_file_inside_is_read_and_nothing_else(root: int) -> None:
    assert read(root, "a", "b", "f.txt") == b"inside"
    with pytest.raises(IsADirectoryError):
        beneath.open_file(root, ("a",))
    with pytest.raises(FileNotFoundError):
        beneath.open_file(root, ("a", "missing"))


def test_a_symlink_in_the_middle_is_refused(root: int, folder: Path, outside: Path) -> None:
    (folder / "out").symlink_to(outside / "dir")
    (folder / "in").symlink_to("a")  # pointing inside: refused all the same (no link is followed)
    loops(lambda: read(root, "out", "x"))
    loops(lambda: read(root, "in", "b", "f.txt"))
    loops(lambda: beneath.open_dir(root, ("out",)))
    loops(lambda: beneath.lstat(root, ("out", "x")))
    loops(lambda: beneath.make_dirs(root, ("out", "new")))
    assert sorted(os.listdir(outside / "dir")) == ["x"]


def test_a_symlink_at_the_end_is_refused_or_handled_itself(root: int, folder: Path, outside: Path) -> None:
    (folder / "f").symlink_to(outside / "secret")
    loops(lambda: read(root, "f"))
    loops(lambda: beneath.open_file(root, ("f",), os.O_WRONLY | os.O_APPEND))
    loops(lambda: beneath.open_at(root, ("f",), os.O_PATH))
    assert stat.S_ISLNK(beneath.lstat(root, ("f",)).st_mode)  # looked at, not followed
    with beneath.parent(root, ("f",)) as (at, name):
        os.unlink(name, dir_fd=at)  # what the file API's DELETE does: the link goes
    assert not os.path.lexists(folder / "f") and (outside / "secret").read_bytes() == SECRET


def test_an_absolute_symlink_is_refused(root: int, folder: Path) -> None:
    (folder / "etc").symlink_to("/etc")
    (folder / "passwd").symlink_to("/etc/passwd")
    loops(lambda: read(root, "etc", "passwd"))
    loops(lambda: read(root, "passwd"))


@pytest.mark.parametrize("parts", [("..", "outside", "secret"), ("a", "..", "..", "outside"), ("a/../..",), ("",)])
def test_parts_that_are_not_names_are_refused(root: int, parts: tuple[str, ...]) -> None:
    with pytest.raises(OSError) as refused:
        beneath.open_at(root, parts, os.O_RDONLY)
    assert refused.value.errno == errno.EXDEV


def test_the_kernel_keeps_openat2_beneath_the_directory(root: int) -> None:
    with pytest.raises(OSError) as refused:
        beneath.openat2(root, "a/../../outside/secret", os.O_RDONLY)
    assert refused.value.errno == errno.EXDEV
    with beneath.held(beneath.openat2(root, "a/../a/b/f.txt", os.O_RDONLY)) as fd:
        assert os.read(fd, 100) == b"inside"  # beneath all the way: allowed


def test_a_directory_swapped_for_a_link_leads_nowhere(root: int, folder: Path, outside: Path) -> None:
    with beneath.held(beneath.open_dir(root, ("a",))) as held:
        (folder / "a").rename(folder / "moved")
        (folder / "a").symlink_to(outside / "dir")
        loops(lambda: read(root, "a", "x"))  # the path now names a link: refused
        assert read(held, "b", "f.txt") == b"inside"  # the descriptor is the directory that was opened
        assert tree_bytes(root, ("a",)) == 0  # a link counts nothing
        loops(lambda: beneath.remove_tree(root, "a"))
    assert (outside / "dir" / "x").read_bytes() == b"outside x"


def test_no_fifo_or_device_is_opened(root: int, folder: Path) -> None:
    os.mkfifo(folder / "fifo")  # opening it for reading would block until a writer came
    with pytest.raises(beneath.NotAFile):
        beneath.open_file(root, ("fifo",))
    os.symlink("/dev/null", folder / "null")
    loops(lambda: beneath.open_file(root, ("null",)))


def test_the_walk_stays_inside_and_gives_a_directory_after_its_entries(root: int, folder: Path, outside: Path) -> None:
    (folder / "a" / "out").symlink_to(outside / "dir")
    (folder / "a" / "secret").symlink_to(outside / "secret")
    seen = [(name, stat.S_IFMT(info.st_mode)) for _, name, info in beneath.walk(root)]
    assert sorted(seen) == sorted(
        [
            ("f.txt", stat.S_IFREG),
            ("b", stat.S_IFDIR),
            ("out", stat.S_IFLNK),
            ("secret", stat.S_IFLNK),
            ("a", stat.S_IFDIR),
        ]
    )
    assert [n for n, _ in seen].index("f.txt") < [n for n, _ in seen].index("b") < [n for n, _ in seen].index("a")


def test_remove_tree_removes_links_not_their_targets(root: int, folder: Path, outside: Path) -> None:
    (folder / "a" / "out").symlink_to(outside / "dir")
    (folder / "a" / "secret").symlink_to(outside / "secret")
    (folder / "a" / "b" / "deep").mkdir()
    (folder / "a" / "b" / "deep" / "more.bin").write_bytes(b"z" * 100)
    assert beneath.remove_tree(root, "a") == len(b"inside") + 100
    assert os.listdir(folder) == []
    assert (outside / "secret").read_bytes() == SECRET and os.listdir(outside / "dir") == ["x"]


def test_make_dirs_makes_each_level_and_enters_none_by_a_link(root: int, folder: Path, outside: Path) -> None:
    beneath.make_dirs(root, ("a", "new", "deeper"))
    assert (folder / "a" / "new" / "deeper").is_dir()
    (folder / "a" / "new" / "link").symlink_to(outside / "dir")
    loops(lambda: beneath.make_dirs(root, ("a", "new", "link", "sub")))
    assert os.listdir(outside / "dir") == ["x"]


def test_tree_bytes_counts_regular_files_and_follows_no_symlink(tmp_path: Path, outside: Path) -> None:
    (outside / "big.bin").write_bytes(b"x" * 10_000)
    root = tmp_path / "counted"
    (root / "a" / "b").mkdir(parents=True)
    (root / "top.txt").write_bytes(b"1234")
    (root / "a" / "b" / "deep.bin").write_bytes(b"y" * 300)
    (root / "a" / ".caravan-upload-x").write_bytes(b"z" * 5)  # a hidden file holds bytes too
    (root / "a" / "to-outside").symlink_to(outside)  # a session's link out counts nothing
    (root / "a" / "to-file").symlink_to(outside / "big.bin")
    os.mkfifo(root / "fifo")
    assert folder_bytes(root) == 4 + 300 + 5
    with beneath.held(beneath.open_root(root)) as fd:
        assert tree_bytes(fd) == 4 + 300 + 5
        assert tree_bytes(fd, ("a", "b", "deep.bin")) == 300
        assert tree_bytes(fd, ("a", "to-file")) == 0
        assert tree_bytes(fd, ("a", "to-outside")) == 0
        assert tree_bytes(fd, ("missing",)) == 0
    assert folder_bytes(tmp_path / "not-there") == 0
