"""What a power cut would keep, read from an strace of a process that acknowledges writes.

A SIGKILL leaves the page cache alone, so kill tests cannot see what a power cut loses: data
that was written but never synced, a file size never synced, a directory entry (of a new file
or a new directory) whose directory was never fsync'd.  This module replays a recorded trace
of the system calls that create, write, map and sync files and checks every acknowledgement
in it against them.  It is pure logic: trace lines in, violations out.

The trace is ``strace -f -y`` output (``-y`` prints the path behind every file descriptor) of
:data:`SYSCALLS`.  An acknowledgement is a ``write`` to file descriptor 1 of a line::

    ACK <path relative to the store root> [<first byte> <end byte>]

naming the file that holds what was acknowledged and, for a file written through a shared
mapping, the byte range of it.  Memory writes are invisible to strace, so a range is durable
once an msync whose range covers it returned (an msync only reaches bytes written before it:
the writer publishes its end only after copying).  Writes through system calls are visible, so
for every file: each ``write``/``pwrite`` to it that returned before the acknowledgement must
be followed by a sync of it that began after that write returned.

At each acknowledgement, with "synced after X" meaning an ``fsync``/``fdatasync`` (or a
``sync``/``syncfs``) that began after X returned and returned before the acknowledgement:

* data: the range is covered by a returned msync; every earlier write(2) to the file is
  synced after it;
* size: the file's last ``ftruncate`` is synced after it (msync need not write metadata);
* entry: if the file was created or renamed into place during the run, its directory is
  synced after that;
* ancestors: every directory on its path created during the run has its own parent synced
  after its ``mkdir``.

A call that strace splits into ``<unfinished ...>`` and ``<... resumed>`` lines began at the
first and returned at the second: a sync counts only from where it began, and only once it
returned.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import PurePosixPath

import attrs

SYSCALLS = (
    "openat", "?open", "?creat", "?mkdir", "mkdirat", "?rename", "renameat", "renameat2",
    "?unlink", "unlinkat", "fsync", "fdatasync", "msync", "sync", "syncfs", "sync_file_range",
    "ftruncate", "mmap", "munmap", "write", "pwrite64", "writev", "pwritev", "pwritev2",
)
"""For ``strace -e trace=``: ``?`` skips a call the architecture lacks (aarch64 has no
``open``)."""

_LINE = re.compile(r"^(?P<pid>\d+)\s+(?P<rest>.*)$")
_UNFINISHED = " <unfinished ...>"
_RESUMED = re.compile(r"^<\.\.\. (?P<name>\w+) resumed>(?P<tail>.*)$")
_CALL = re.compile(r"^(?P<name>\w+)\((?P<args>.*)\)\s+=\s+(?P<ret>.*)$")
_FD = re.compile(r"^(?:AT_FDCWD|\d+)<(?P<path>.*)>$")  # a descriptor and, with -y, its path
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
_ACK = re.compile(r"^ACK (?P<path>\S+)(?: (?P<lo>\d+) (?P<hi>\d+))?\\n$")
_WRITES = {"write", "pwrite64", "writev", "pwritev", "pwritev2"}
_SYNCS = {"fsync", "fdatasync"}


@attrs.frozen
class Call:
    """One completed system call: where it began and returned (line numbers of the trace)."""

    name: str
    args: list[str]
    ret: str
    began: int
    returned: int


@attrs.frozen
class Violation:
    line: int
    """Trace line of the acknowledgement."""
    ack: str
    rule: str
    """``data``, ``size``, ``entry`` or ``ancestor``."""
    path: str
    why: str

    def __str__(self) -> str:
        return f"line {self.line} {self.ack!r}: {self.rule} of {self.path}: {self.why}"


def calls(lines: Iterable[str]) -> list[Call]:
    """The completed calls of a ``strace -f`` trace, in the order they returned."""
    pending: dict[str, tuple[int, str]] = {}
    out: list[Call] = []
    for n, raw in enumerate(lines, 1):
        m = _LINE.match(raw.rstrip("\n"))
        if m is None:
            continue
        pid, rest = m["pid"], m["rest"]
        began = n
        if rest.endswith(_UNFINISHED):
            pending[pid] = (n, rest[: -len(_UNFINISHED)])
            continue
        resumed = _RESUMED.match(rest)
        if resumed is not None:
            if pid not in pending:
                continue  # began before the trace did
            began, head = pending.pop(pid)
            rest = head + resumed["tail"]
        call = _CALL.match(rest)
        if call is not None:
            out.append(Call(call["name"], split_args(call["args"]), call["ret"].strip(),
                            began, n))
    return out


def split_args(args: str) -> list[str]:
    """Top-level comma-separated arguments; commas inside quotes, ``<path>``, ``[]`` and
    ``{}`` stay."""
    out: list[str] = []
    depth, quoted, escaped, start = 0, False, False, 0
    for i, ch in enumerate(args):
        if quoted:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif ch in "<[{(":
            depth += 1
        elif ch in ">]})":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(args[start:i].strip())
            start = i + 1
    tail = args[start:].strip()
    if tail:
        out.append(tail)
    return out


def _fd_path(arg: str) -> str | None:
    m = _FD.match(arg)
    return m["path"] if m is not None else None


def _string(arg: str) -> str | None:
    m = _STRING.fullmatch(arg)
    return m.group(1) if m is not None else None


def _at(dirfd: str, name: str) -> str:
    """A path given relative to a directory descriptor (``AT_FDCWD</cwd>`` too)."""
    if name.startswith("/"):
        return name
    return str(PurePosixPath(_fd_path(dirfd) or "/") / name)


def _ok(ret: str) -> bool:
    return not ret.startswith("-1") and not ret.startswith("?")


@attrs.define
class _Mapping:
    start: int
    length: int
    path: str
    offset: int


@attrs.define
class _State:
    exists: set[str] = attrs.Factory(set)
    created: dict[str, int] = attrs.Factory(dict)  # path -> line its creation returned
    resized: dict[str, int] = attrs.Factory(dict)
    written: dict[str, list[int]] = attrs.Factory(lambda: defaultdict(list))
    synced: dict[str, list[tuple[int, int]]] = attrs.Factory(lambda: defaultdict(list))
    whole_syncs: list[tuple[int, int]] = attrs.Factory(list)  # sync(2), syncfs(2)
    msynced: dict[str, list[tuple[int, int, int]]] = attrs.Factory(lambda: defaultdict(list))
    maps: list[_Mapping] = attrs.Factory(list)

    def synced_after(self, path: str, after: int, before: int) -> bool:
        return any(after < b and r < before
                   for b, r in (*self.synced.get(path, ()), *self.whole_syncs))


def check(lines: Iterable[str], root: str) -> tuple[int, list[Violation]]:
    """Replay the trace; returns how many acknowledgements it holds and what a power cut at
    each of them would have lost."""
    st = _State()
    acks = 0
    violations: list[Violation] = []
    for c in calls(lines):
        if c.name == "write" and c.args and c.args[0].startswith("1<"):
            text = _string(c.args[1]) if len(c.args) > 1 else None
            ack = _ACK.match(text) if text is not None else None
            if ack is not None:
                acks += 1
                violations += _check_ack(st, c.began, text.removesuffix("\\n"),
                                         str(PurePosixPath(root) / ack["path"]),
                                         (int(ack["lo"]), int(ack["hi"])) if ack["lo"] else None)
                continue
        if _ok(c.ret):
            _apply(st, c)
    return acks, violations


def _apply(st: _State, c: Call) -> None:
    name, a = c.name, c.args
    if name in ("openat", "open", "creat"):
        path = _fd_path(c.ret)
        flags = a[2] if name == "openat" else a[1] if name == "open" else "O_CREAT"
        if path is not None and "O_CREAT" in flags and path not in st.exists:
            st.exists.add(path)
            st.created[path] = c.returned
    elif name in ("mkdir", "mkdirat"):
        path = _string(a[0]) if name == "mkdir" else None
        path = path if path is not None else _at(a[0], _string(a[1]) or "")
        st.exists.add(path)
        st.created[path] = c.returned
    elif name in ("rename", "renameat", "renameat2"):
        old, new = ((_string(a[0]) or "", _string(a[1]) or "") if name == "rename"
                    else (_at(a[0], _string(a[1]) or ""), _at(a[2], _string(a[3]) or "")))
        st.exists.discard(old)
        st.exists.add(new)
        st.created[new] = c.returned
        for table in (st.resized, st.written, st.synced, st.msynced):
            if old in table:
                table[new] = table.pop(old)
        for m in st.maps:  # a mapping follows its file: later msyncs reach the new name
            if m.path == old:
                m.path = new
    elif name in ("unlink", "unlinkat"):
        path = _string(a[0]) if name == "unlink" else _at(a[0], _string(a[1]) or "")
        st.exists.discard(path or "")
    elif name in _SYNCS:
        path = _fd_path(a[0])
        if path is not None:
            st.synced[path].append((c.began, c.returned))
    elif name in ("sync", "syncfs"):
        st.whole_syncs.append((c.began, c.returned))
    elif name == "ftruncate":
        path = _fd_path(a[0])
        if path is not None:
            st.resized[path] = c.returned
    elif name in _WRITES:
        path = _fd_path(a[0])
        if path is not None:
            st.written[path].append(c.returned)
    elif name == "mmap":
        path = _fd_path(a[4])
        if path is not None and "MAP_SHARED" in a[3]:
            st.maps.append(_Mapping(int(c.ret, 16), int(a[1]), path, int(a[5], 0)))
    elif name == "munmap":
        start = int(a[0], 16)
        st.maps = [m for m in st.maps if m.start != start]
    elif name == "msync" and "MS_SYNC" in a[2]:
        addr, length = int(a[0], 16), int(a[1])
        for m in st.maps:
            if m.start <= addr < m.start + m.length:
                lo = m.offset + addr - m.start
                st.msynced[m.path].append((lo, lo + length, c.returned))


def _check_ack(
    st: _State, at: int, ack: str, path: str, span: tuple[int, int] | None
) -> list[Violation]:
    out: list[Violation] = []

    def violated(rule: str, p: str, why: str) -> None:
        out.append(Violation(at, ack, rule, p, why))

    if span is not None:
        lo, hi = span
        if not any(a <= lo and hi <= b and r < at for a, b, r in st.msynced.get(path, ())):
            violated("data", path, f"no msync covering bytes [{lo}, {hi}) returned")
    for w in st.written.get(path, ()):
        if w < at and not st.synced_after(path, w, at):
            violated("data", path, f"the write that returned at line {w} was never synced")
            break
    if path in st.resized and st.resized[path] < at and not st.synced_after(
        path, st.resized[path], at
    ):
        violated("size", path, f"ftruncate at line {st.resized[path]} was never fsync'd")
    child = PurePosixPath(path)
    rule = "entry"
    while child.parent != child:
        created = st.created.get(str(child))
        if created is not None and created < at and not st.synced_after(
            str(child.parent), created, at
        ):
            violated(rule, str(child), f"created at line {created}; {child.parent} "
                                       "never fsync'd after that")
        child, rule = child.parent, "ancestor"
    return out
