"""The ring's shared-memory segment: private (mode 0600, an unguessable name never reused), its space
reserved when it is made, and checked by whoever attaches to it."""

import errno
import os
import re
import stat
from pathlib import Path

import pytest

import infeed
from infeed import Daemon, Dataset
from infeed.ring import Ring, segments
from infeed.ring.segments import SHM_DIR

from .processes import SPEC, children, write_files

TEMPLATE = {"x": ((4, 3), "float32"), "label": ((4,), "int64")}


def _segments():
    return {n for n in os.listdir(SHM_DIR) if n.startswith(f"infeed-{os.getuid()}-")}


@pytest.fixture
def ring():
    with Ring.create(TEMPLATE, slots=3, lock_memory=False) as r:
        yield r


# --- too little space ----------------------------------------------------------------------------

@pytest.fixture
def tiny_shm(monkeypatch):
    """/dev/shm as statvfs reports it: one free 4096-byte block."""
    real = os.statvfs(SHM_DIR)

    class Tiny:
        f_bavail, f_frsize, f_bsize = 1, 4096, real.f_bsize

    monkeypatch.setattr(segments.os, "statvfs", lambda path: Tiny())


@pytest.mark.serial
def test_too_little_shm_space_names_needed_and_free_bytes(tiny_shm):
    before = _segments()
    with pytest.raises(infeed.ShmSpaceError) as info:
        Ring.create(TEMPLATE, slots=4, lock_memory=False)
    err = info.value
    assert err.free == 4096 and err.needed > err.free and err.errno == errno.ENOSPC
    assert f"needs {err.needed} bytes" in str(err) and f"only {err.free} are free" in str(err)
    assert _segments() == before


@pytest.mark.serial
def test_a_daemon_too_big_for_shm_fails_at_creation_before_any_worker_starts(tiny_shm, tmp_path):
    ds = Dataset(write_files(tmp_path), SPEC, batch_size=1000)
    before, kids = _segments(), children()
    with pytest.raises(infeed.ShmSpaceError, match=r"needs \d+ bytes but only 4096 are free"):
        Daemon(ds, num_workers=2, lock_memory=False)
    assert _segments() == before and children() == kids


@pytest.mark.serial
def test_space_lost_between_check_and_reservation_raises_and_removes_the_segment(monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    before = _segments()
    monkeypatch.setattr(segments.os, "posix_fallocate", full)
    with pytest.raises(infeed.ShmSpaceError, match="bytes but only"):
        Ring.create(TEMPLATE, slots=1, lock_memory=False)
    assert _segments() == before


def test_the_whole_segment_is_reserved_at_creation(ring):
    """Every page has its block in the tmpfs from the start: a write can never meet a full /dev/shm (SIGBUS)."""
    st = os.stat(ring.path)
    assert st.st_size == ring.size and st.st_blocks * 512 >= ring.size


# --- a private segment ---------------------------------------------------------------------------

def test_segment_is_mode_0600_with_a_128_bit_random_name(monkeypatch):
    drawn = []
    real = segments.secrets.token_hex                 # the OS's random source
    monkeypatch.setattr(segments.secrets, "token_hex", lambda n: drawn.append(n) or real(n))
    with Ring.create(TEMPLATE, slots=1, lock_memory=False) as a, \
            Ring.create(TEMPLATE, slots=1, lock_memory=False) as b:
        assert drawn == [16, 16]                      # 16 bytes: 128 bits for each name
        assert re.fullmatch(rf"infeed-{os.getuid()}-[0-9a-f]{{32}}", a.name)
        assert a.name != b.name
        st = os.stat(a.path)
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid() and st.st_size == a.size


def test_a_daemons_segment_is_mode_0600_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        with Daemon(Dataset(write_files(tmp_path), SPEC, batch_size=4), num_workers=1, lock_memory=False) as feed:
            assert stat.S_IMODE(os.stat(feed.ring.path).st_mode) == 0o600
    finally:
        os.umask(old)


def test_an_existing_name_is_never_reused(monkeypatch):
    taken = "ab" * 16
    path = Path(SHM_DIR) / f"infeed-{os.getuid()}-{taken}"
    path.write_bytes(b"someone else's")
    try:
        tokens = iter([taken, "cd" * 16])
        monkeypatch.setattr(segments.secrets, "token_hex", lambda n: next(tokens))
        with Ring.create(TEMPLATE, slots=1, lock_memory=False) as r:
            assert r.name.endswith("cd" * 16)
        assert path.read_bytes() == b"someone else's"
    finally:
        path.unlink()


def test_a_link_planted_under_the_next_name_is_neither_followed_nor_reused(monkeypatch, tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    link = Path(SHM_DIR) / f"infeed-{os.getuid()}-{'ef' * 16}"
    link.symlink_to(victim)
    try:
        tokens = iter(["ef" * 16, "01" * 16])
        monkeypatch.setattr(segments.secrets, "token_hex", lambda n: next(tokens))
        with Ring.create(TEMPLATE, slots=1, lock_memory=False) as r:
            assert r.name.endswith("01" * 16)
        assert victim.read_bytes() == b"keep me" and link.is_symlink()
    finally:
        link.unlink()


# --- attach checks -------------------------------------------------------------------------------

def _poke(path, offset, data):
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


@pytest.mark.parametrize("check", ["magic", "version", "layout", "steps", "owner", "mode", "exists", "state"])
def test_attach_names_the_check_that_failed(ring, check, monkeypatch):
    name, template = ring.name, dict(TEMPLATE)
    if check == "magic":
        _poke(ring.path, 0, b"NOTARING")
    elif check == "version":
        _poke(ring.path, 8, (99).to_bytes(4, "little"))
    elif check == "state":
        _poke(ring.path, 12, (0).to_bytes(4, "little"))
    elif check == "layout":
        template["x"] = ((5, 3), "float32")
    elif check == "owner":                  # the segment is another user's: seen as that user would see it
        uid = os.getuid()
        monkeypatch.setattr(segments.os, "getuid", lambda: uid + 1)
    elif check == "mode":
        os.chmod(ring.path, 0o644)
    elif check == "exists":
        name = name[:-4] + "0000" if not name.endswith("0000") else name[:-4] + "1111"
    with pytest.raises(infeed.AttachError) as info:
        if check == "steps":
            Ring.attach(name, template, steps_per_slot=2)
        else:
            Ring.attach(name, template)
    e = info.value
    assert e.check == ("layout" if check == "steps" else check)
    assert e.name == name and f"{e.check} check failed" in str(e)
