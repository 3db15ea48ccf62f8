"""The file backend's on-disk znode store: layout, the store lock, the journal, the changelog.

Layout of a store directory (see docs/coordination.md):
    lock                 flock'ed: shared by readers, exclusive by the one writer
    zxid                 the store-wide transaction counter (20 ASCII digits)
    journal              the write-ahead intent of the mutation being applied (checksummed;
                         its header is zeroed once the mutation has landed)
    changes              the changelog: one JSON line per zxid, tailed by every client's watches
                         (a batch of mutations appends all its lines in one write)
    tree/<name>/.../%znode   one file per znode: a fixed header (the stat), child names, data
    ephemerals/<session>     the paths of a session's ephemeral znodes (so a reaper finds them)
    sessions/<session>       one file per live session, flock'ed by its owner (file_session.py)
    tmp/                 staging for atomic renames; leftovers are swept by the next recovery

Rules: every mutation runs under the exclusive lock and is staged first: new znode files are
written in tmp/, then the journal record (length and CRC-32 in its header, written in place)
lists every rename and unlink and carries the new bytes of every znode that already existed;
then they are applied (renames, unlinks, and those znodes rewritten in place), the changelog
line appended and the counter bumped, then the journal's header zeroed. A process killed
anywhere in that sequence leaves either no valid journal record (nothing visible happened; a
torn record fails its CRC) or a complete one that the next lock holder replays; every journal
step is idempotent. Readers hold the shared lock, so they never see half of a multi-znode
mutation, and replay before reading, so none sees a znode a killed writer left half rewritten.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import itertools
import json
import os
import shutil
import struct
import threading
import time
import urllib.parse
import zlib
from dataclasses import dataclass, field

from localcluster.coord.interface import BadPathError, CoordinationError, ZnodeStat

ZNODE_FILE = "%znode"  # '%' is always percent-encoded in child directory names: no clash
NAME_BYTES_MAX = 255  # a directory entry on Linux filesystems
CHANGELOG_ROTATE_BYTES = 8 << 20
_HEADER = struct.Struct("<4s9qII")  # magic, 9 counters, children bytes, data bytes
_MAGIC = b"ZND1"
_JOURNAL_HEADER = struct.Struct("<4sII")  # magic, payload bytes, CRC-32 of the payload
_JOURNAL_MAGIC = b"JRN1"  # payload: the record's JSON (written by earlier versions; still replayed)
_JOURNAL_MAGIC_WITH_DATA = b"JRN2"  # payload: JSON length, the JSON, the in-place writes' bytes
_JSON_LENGTH = struct.Struct("<I")


class StoreCorruptError(CoordinationError):
    """A store file failed validation; the message names the file and how to recover."""


@dataclass
class Znode:
    data: bytes
    czxid: int
    mzxid: int
    pzxid: int
    ctime: int
    mtime: int
    ephemeral_owner: int = 0
    version: int = 0
    cversion: int = 0
    # ZooKeeper 3.8 numbers sequential children by the creates under this znode (its
    # cversion counts the deletes as well; the contract tests hold us to the server).
    child_creates: int = 0
    children: list[str] = field(default_factory=list)

    def copy(self) -> Znode:
        """A copy to modify (its own child list); dataclasses.replace took 5 us a znode."""
        return Znode(self.data, self.czxid, self.mzxid, self.pzxid, self.ctime, self.mtime,
                     self.ephemeral_owner, self.version, self.cversion, self.child_creates,
                     list(self.children))  # fmt: skip

    def stat(self) -> ZnodeStat:
        return ZnodeStat(
            self.czxid, self.mzxid, self.ctime, self.mtime, self.version, self.cversion,
            0, self.ephemeral_owner, len(self.data), len(self.children), self.pzxid,
        )  # fmt: skip

    def encode(self) -> bytes:
        names = "\0".join(self.children).encode()
        header = _HEADER.pack(
            _MAGIC, self.czxid, self.mzxid, self.pzxid, self.ctime, self.mtime,
            self.ephemeral_owner, self.version, self.cversion, self.child_creates,
            len(names), len(self.data),
        )  # fmt: skip
        return header + names + self.data

    @classmethod
    def decode(cls, raw: bytes, where: str) -> Znode:
        if len(raw) < _HEADER.size:
            raise StoreCorruptError(
                f"znode file {where} is {len(raw)} bytes, shorter than its header"
            )
        magic, *stat, names_len, data_len = _HEADER.unpack_from(raw)
        if magic != _MAGIC or _HEADER.size + names_len + data_len != len(raw):
            raise StoreCorruptError(
                f"znode file {where} is not a valid znode (bad magic or length); "
                "it was not written by this store version: restore or delete the store directory"
            )
        names = raw[_HEADER.size : _HEADER.size + names_len].decode()
        return cls(
            raw[_HEADER.size + names_len :], *stat, children=names.split("\0") if names else []
        )


@functools.lru_cache(maxsize=1 << 16)  # names repeat across paths: brokers, topics, numbers
def encode_name(name: str) -> str:
    encoded = urllib.parse.quote(name, safe="")
    if len(encoded.encode()) > NAME_BYTES_MAX:
        raise BadPathError(
            f"znode name {name[:40]!r}... is {len(encoded)} bytes once percent-encoded; the file "
            f"backend stores names as directory entries, limited to {NAME_BYTES_MAX} bytes"
        )
    return encoded


@functools.lru_cache(maxsize=1 << 16)  # a failover reads and writes every partition's znode
def relative_znode_dir(path: str) -> str:
    """The directory of a (valid) znode path, relative to the store's root."""
    if path == "/":
        return "tree"
    return "tree/" + "/".join(encode_name(n) for n in path[1:].split("/"))


def relative_znode_file(path: str) -> str:
    return relative_znode_dir(path) + "/" + ZNODE_FILE


LOCK_FILE = "lock"  # flock'ed: shared by readers, exclusive by writers (and by lock_held)


def _open_lock(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


@contextlib.contextmanager
def lock_held(root: str, timeout_s: float = 10.0):
    """Hold the store's lock exclusively: meanwhile no process is inside a store operation.

    For stopping a process at a safe moment (cluster.pause): a process stopped while holding
    the lock would stop every other client of the store until it runs again. Raises
    TimeoutError when the lock stays taken for `timeout_s` (a stopped process holds it)."""
    fd = _open_lock(os.path.join(os.path.abspath(root), LOCK_FILE))
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"the store lock {root}/{LOCK_FILE} stayed taken for {timeout_s:g} s"
                    ) from None
                time.sleep(0.001)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class FileStore:
    """One process's handle on a store directory. Not thread-safe by itself: callers hold
    `shared()` or `exclusive()`, which also serialise the threads of this handle."""

    def __init__(self, root: str, fsync: bool = False):
        self.root = os.path.abspath(root)
        self.fsync = fsync
        self._thread_lock = threading.RLock()
        self._temp_names = itertools.count()
        self._depth = 0
        for sub in ("tree", "tmp", "sessions", "ephemerals"):
            os.makedirs(self.path(sub), exist_ok=True)
        self._lock_fd = _open_lock(self.path(LOCK_FILE))
        self._zxid_fd = os.open(self.path("zxid"), os.O_RDWR | os.O_CREAT, 0o644)
        self._journal_fd = os.open(self.path("journal"), os.O_RDWR | os.O_CREAT, 0o644)
        with self.exclusive():
            if self.read_znode("/") is None:  # a fresh store: the root exists from zxid 0
                self._write_file(self.znode_file("/"), Znode(b"", 0, 0, 0, 0, 0).encode())
            if not os.path.exists(self.path("changes")):
                self._write_file(self.path("changes"), json.dumps([0, None]).encode() + b"\n")

    def close(self) -> None:
        for fd in (self._lock_fd, self._zxid_fd, self._journal_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def znode_dir(self, path: str) -> str:
        return self.root + "/" + relative_znode_dir(path)

    def znode_file(self, path: str) -> str:
        return self.root + "/" + relative_znode_file(path)

    # -- locking -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def shared(self):
        with self._thread_lock:
            if self._depth:
                yield
                return
            fcntl.flock(self._lock_fd, fcntl.LOCK_SH)
            self._depth += 1
            try:
                if self.journal_pending():  # a writer died mid-mutation
                    fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
                    self.recover()
                yield
            finally:
                self._depth -= 1
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def exclusive(self):
        with self._thread_lock:
            assert self._depth == 0, "the store lock is not re-entrant across shared/exclusive"
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            self._depth += 1
            try:
                if self.journal_pending():
                    self.recover()
                yield
            finally:
                self._depth -= 1
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    # -- reading (caller holds a lock) ---------------------------------------------------------

    def read_zxid(self) -> int:
        raw = os.pread(self._zxid_fd, 32, 0)
        return int(raw) if raw.strip() else 0

    def read_znode(self, path: str) -> Znode | None:
        where = self.znode_file(path)
        try:
            with open(where, "rb") as f:
                raw = f.read()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return Znode.decode(raw, where)

    def read_file(self, relative: str) -> bytes | None:
        try:
            with open(self.path(relative), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    # -- writing (caller holds the exclusive lock) ---------------------------------------------

    def _write_file(self, target: str, raw: bytes) -> None:
        temp = self.path("tmp", f"{os.getpid()}.{next(self._temp_names)}")
        self._write_temp(temp, raw)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.rename(temp, target)

    def _write_temp(self, temp: str, raw: bytes) -> None:
        with open(temp, "wb") as f:
            f.write(raw)
            if self.fsync:
                f.flush()
                os.fsync(f.fileno())

    def commit(self, zxid: int, nodes: dict, files: dict, changes: list) -> None:
        """Apply one mutation: nodes maps path -> Znode or None (deleted), files maps a
        store-relative path -> bytes or None, changes are the changelog's (type, path) pairs."""
        self.commit_lines(nodes, files, [[zxid, changes]])

    def commit_lines(self, nodes: dict, files: dict, lines: list) -> None:
        """Apply the merged writes of one or more mutations (a batch) as one: one journal
        record, so a kill leaves all of them or none; `lines` holds each mutation's
        [zxid, changes] in zxid order, appended to the changelog in one write."""
        self.maybe_rotate_changelog()
        first_zxid = lines[0][0]
        puts, writes, deletes, data = [], [], [], []
        size = 0
        for path in sorted(nodes, key=lambda p: p.count("/")):  # parents before children
            node, target = nodes[path], relative_znode_file(path)
            if node is None:
                deletes.append(os.path.dirname(target))
            elif node.czxid < first_zxid:
                # It existed before this commit, so its file does: rewritten in place from the
                # journal's copy. Creating, unlinking and renaming a file per znode cost ext4
                # 120-680 us each (a controller failover writes thousands); this costs ~20 us.
                raw = node.encode()
                writes.append([target, size, len(raw)])
                data.append(raw)
                size += len(raw)
            else:
                puts.append([target, self._stage(node.encode())])
        for relative, raw in files.items():
            if raw is None:
                deletes.append(relative)
            else:
                puts.append([relative, self._stage(raw)])
        deletes.sort(key=lambda p: -p.count("/"))  # children before parents
        journal = {
            "zxid": lines[-1][0],
            "puts": puts,
            "writes": writes,
            "deletes": deletes,
            "lines": lines,
        }
        text = json.dumps(journal, separators=(",", ":")).encode()
        payload = b"".join([_JSON_LENGTH.pack(len(text)), text, *data])
        header = _JOURNAL_HEADER.pack(_JOURNAL_MAGIC_WITH_DATA, len(payload), zlib.crc32(payload))
        os.pwrite(self._journal_fd, header + payload, 0)
        if self.fsync:
            os.fsync(self._journal_fd)
        journal["data"] = memoryview(payload)[_JSON_LENGTH.size + len(text) :]
        self._apply(journal)

    def _stage(self, raw: bytes) -> str:
        relative = os.path.join("tmp", f"{os.getpid()}.{next(self._temp_names)}")
        self._write_temp(self.path(relative), raw)
        return relative

    def _apply(self, journal: dict) -> None:
        for relative in journal["deletes"]:
            self._remove(self.path(relative))
        for target, staged in journal["puts"]:
            target, staged = self.path(target), self.path(staged)
            if not os.path.exists(staged):
                continue  # renamed by the attempt this replay finishes
            # Unlink, then rename: ext4 flushes a file renamed over an existing one
            # (auto_da_alloc), which costs a disk write per mutation. Nobody sees the gap:
            # readers wait for our lock, and a replay redoes the rename from the staged file.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(target)
            try:
                os.rename(staged, target)
            except FileNotFoundError:
                os.makedirs(os.path.dirname(target), exist_ok=True)  # a new znode's directory
                os.rename(staged, target)
        data = journal.get("data", b"")  # a record of an earlier version has no writes
        for target, offset, length in journal.get("writes", ()):
            self._write_in_place(self.path(target), data[offset : offset + length])
        # A journal left by a version that committed one mutation per record has "changes".
        lines = journal.get("lines") or [[journal["zxid"], journal["changes"]]]
        self._append_changelog(lines)
        os.pwrite(self._zxid_fd, b"%020d\n" % journal["zxid"], 0)
        if self.fsync:  # the renames, unlinks, changelog and counter are durable before...
            self._fsync_landed(journal)
        os.pwrite(self._journal_fd, bytes(_JOURNAL_HEADER.size), 0)  # ...it stops being pending

    def _write_in_place(self, target: str, raw) -> None:
        """Rewrite a znode's file with raw: written over it from the start, then cut to its
        length. A kill between the two leaves it torn, but only while its journal record is
        pending: the next lock holder replays the record before anyone reads."""
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the directory went missing (a damaged store): made again
            os.makedirs(os.path.dirname(target), exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            written = 0
            while written < len(raw):  # short only when the filesystem is nearly full
                written += os.pwrite(fd, raw[written:], written)
            os.ftruncate(fd, len(raw))
            if self.fsync:  # durable before the journal record stops being pending
                os.fsync(fd)
        finally:
            os.close(fd)

    def _fsync_landed(self, journal: dict) -> None:
        directories = {os.path.dirname(self.path(target)) for target, _ in journal["puts"]}
        directories |= {os.path.dirname(self.path(relative)) for relative in journal["deletes"]}
        for directory in directories:
            with contextlib.suppress(FileNotFoundError):  # removed by this very mutation
                fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        for path in (self.path("changes"), self.path("zxid")):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def journal_pending(self) -> dict | None:
        """The journal record of a mutation that did not finish landing, if there is one."""
        header = os.pread(self._journal_fd, _JOURNAL_HEADER.size, 0)
        if len(header) < _JOURNAL_HEADER.size:
            return None
        magic, length, checksum = _JOURNAL_HEADER.unpack(header)
        if magic not in (_JOURNAL_MAGIC, _JOURNAL_MAGIC_WITH_DATA):
            return None
        payload = os.pread(self._journal_fd, length, _JOURNAL_HEADER.size)
        if len(payload) != length or zlib.crc32(payload) != checksum:
            return None  # torn while being written: nothing of that mutation was applied
        if magic == _JOURNAL_MAGIC:
            return json.loads(payload)
        (text_length,) = _JSON_LENGTH.unpack_from(payload)
        journal = json.loads(payload[_JSON_LENGTH.size : _JSON_LENGTH.size + text_length])
        journal["data"] = payload[_JSON_LENGTH.size + text_length :]
        return journal

    def _remove(self, target: str) -> None:
        if os.path.basename(target) == ZNODE_FILE or not target.startswith(self.path("tree")):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(target)
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(target, ZNODE_FILE))
        try:
            os.rmdir(target)
        except FileNotFoundError:
            pass
        except OSError as error:  # stale directories of znodes deleted earlier: never visible
            if error.errno != errno.ENOTEMPTY:
                raise
            shutil.rmtree(target)

    def _append_changelog(self, lines: list) -> None:
        text = b"".join(json.dumps(line, separators=(",", ":")).encode() + b"\n" for line in lines)
        fd = os.open(self.path("changes"), os.O_WRONLY | os.O_APPEND)
        try:  # one write for a whole batch; closing is the inotify event watchers wake on
            written = os.write(fd, text)
            while written < len(text):  # a short write to a regular file: only when nearly full
                written += os.write(fd, text[written:])
        finally:
            os.close(fd)

    def maybe_rotate_changelog(self) -> None:
        """Start a fresh changelog when it grows past its bound. Its header line carries the
        last zxid before it, so a reader that skipped a whole file knows it missed changes."""
        if os.stat(self.path("changes")).st_size < CHANGELOG_ROTATE_BYTES:
            return
        header = json.dumps([self.read_zxid(), None]).encode() + b"\n"
        self._write_file(self.path("changes"), header)

    def recover(self) -> None:
        """Finish the mutation a dead writer left behind (caller holds the exclusive lock)."""
        journal = self.journal_pending()
        if journal is not None:
            self._truncate_torn_changelog()
            self._apply(journal)
        for leftover in os.listdir(self.path("tmp")):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path("tmp", leftover))

    def _truncate_torn_changelog(self) -> None:
        """Cut a last line a dead writer left unfinished (it is rewritten by the replay)."""
        with open(self.path("changes"), "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            end = size
            while end > 0:  # scan back in chunks: a big transaction's line can be long
                start = max(0, end - 65536)
                f.seek(start)
                chunk = f.read(end - start)
                if end == size and chunk.endswith(b"\n"):
                    return
                cut = chunk.rfind(b"\n")
                if cut >= 0:
                    f.truncate(start + cut + 1)
                    return
                end = start
            f.truncate(0)
