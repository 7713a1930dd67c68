"""The power-cut checker on its own: hand-written traces and excerpts of recorded ones."""

from __future__ import annotations

from tests.backends.sync_trace import calls, check, split_args

ROOT = "/d/st"
SEG = "/d/st/commitlog/00000000000000000000"

# Recorded (strace -f -y) from tests/backends/power_child.py on the mmap store as it was before
# new files got their directories synced; paths shortened, calls of other files left out.
BEFORE_THE_FIX = f"""\
8009  mkdir("/d/st", 0777) = 0
8009  openat(AT_FDCWD</srv>, "/d/st/abort", O_WRONLY|O_CREAT|O_CLOEXEC, 0666) = 6</d/st/abort>
8009  openat(AT_FDCWD</srv>, "/d/st", O_RDONLY|O_CLOEXEC) = 6</d/st>
8009  fsync(6</d/st>)      = 0
8009  mkdir("/d/st/commitlog", 0777) = 0
8009  openat(AT_FDCWD</srv>, "{SEG}", O_RDWR|O_CREAT|O_CLOEXEC, 0644) = 6<{SEG}>
8009  ftruncate(6<{SEG}>, 65536) = 0
8009  mmap(NULL, 65536, PROT_READ|PROT_WRITE, MAP_SHARED, 6<{SEG}>, 0) = 0x7f1a2cc66000
8009  write(1</tmp/out>, "ACK abort\\n", 10) = 10
8016  msync(0x7f1a2cc66000, 405, MS_SYNC) = 0
8015  msync(0x7f1a2cc66000, 65536, MS_SYNC <unfinished ...>
8009  write(1</tmp/out>, "ACK commitlog/00000000000000000000 0 405\\n", 41) = 41
8015  <... msync resumed>)              = 0
""".splitlines()

# The same run with the fix: every new file and directory has its parent synced once.
AFTER_THE_FIX = f"""\
8127  mkdir("/d/st", 0777) = 0
8127  openat(AT_FDCWD</srv>, "/d", O_RDONLY|O_CLOEXEC) = 3</d>
8127  fsync(3</d>)      = 0
8127  openat(AT_FDCWD</srv>, "/d/st/abort", O_WRONLY|O_CREAT|O_CLOEXEC, 0644) = 6</d/st/abort>
8127  openat(AT_FDCWD</srv>, "/d/st", O_RDONLY|O_CLOEXEC) = 6</d/st>
8127  fsync(6</d/st>)      = 0
8127  mkdir("/d/st/commitlog", 0777) = 0
8127  openat(AT_FDCWD</srv>, "/d/st", O_RDONLY|O_CLOEXEC) = 6</d/st>
8127  fsync(6</d/st>)      = 0
8127  openat(AT_FDCWD</srv>, "{SEG}", O_RDWR|O_CREAT|O_EXCL|O_CLOEXEC, 0644) = 6<{SEG}>
8127  ftruncate(6<{SEG}>, 65536) = 0
8127  fsync(6<{SEG}>) = 0
8127  openat(AT_FDCWD</srv>, "/d/st/commitlog", O_RDONLY|O_CLOEXEC) = 7</d/st/commitlog>
8127  fsync(7</d/st/commitlog>) = 0
8127  mmap(NULL, 65536, PROT_READ|PROT_WRITE, MAP_SHARED, 6<{SEG}>, 0) = 0x7f456c19d000
8127  write(1</tmp/out>, "ACK abort\\n", 10) = 10
8136  msync(0x7f456c19d000, 405, MS_SYNC) = 0
8127  write(1</tmp/out>, "ACK commitlog/00000000000000000000 0 405\\n", 41) = 41
""".splitlines()


def _rules(lines: list[str]) -> set[tuple[str, str, str]]:
    return {(v.ack, v.rule, v.path) for v in check(lines, ROOT)[1]}


def test_todays_store_would_lose_a_synced_record_in_a_new_segment() -> None:
    ack = "ACK commitlog/00000000000000000000 0 405"
    assert _rules(BEFORE_THE_FIX) == {
        ("ACK abort", "ancestor", "/d/st"),
        (ack, "size", SEG),
        (ack, "entry", SEG),
        (ack, "ancestor", "/d/st/commitlog"),
        (ack, "ancestor", "/d/st"),
    }


def test_the_fixed_store_keeps_everything_it_acknowledged() -> None:
    assert check(AFTER_THE_FIX, ROOT) == (2, [])


def _trace(*calls_: str, pid: int = 1) -> list[str]:
    return [c if c[0].isdigit() else f"{pid}  {c}" for c in calls_]


_NEW_FILE = (
    'openat(AT_FDCWD</x>, "/d/st/f", O_RDWR|O_CREAT, 0644) = 3</d/st/f>',
)
_DIR_SYNC = "fsync(4</d/st>) = 0"
_ACK_F = 'write(1<pipe:[1]>, "ACK f\\n", 6) = 6'


def test_a_directory_sync_counts_only_if_it_began_after_the_entry_was_made() -> None:
    began_before = [
        "2  fsync(4</d/st> <unfinished ...>",
        *_trace(*_NEW_FILE),
        "2  <... fsync resumed>) = 0",
        *_trace(_ACK_F),
    ]
    assert _rules(began_before) == {("ACK f", "entry", "/d/st/f")}
    assert _rules(_trace(*_NEW_FILE, _DIR_SYNC, _ACK_F)) == set()


def test_a_sync_still_running_at_the_acknowledgement_does_not_count() -> None:
    lines = [*_trace(*_NEW_FILE), "2  fsync(4</d/st> <unfinished ...>", *_trace(_ACK_F),
             "2  <... fsync resumed>) = 0"]
    assert _rules(lines) == {("ACK f", "entry", "/d/st/f")}


def test_an_open_that_failed_or_found_the_file_creates_nothing_new() -> None:
    lines = _trace(
        *_NEW_FILE, _DIR_SYNC,
        'openat(AT_FDCWD</x>, "/d/st/f", O_RDWR|O_CREAT, 0644) = 5</d/st/f>',
        'openat(AT_FDCWD</x>, "/d/st/g", O_RDWR|O_CREAT|O_EXCL, 0644) = -1 EEXIST (File '
        "exists)",
        _ACK_F, 'write(1<pipe:[1]>, "ACK g\\n", 6) = 6',
    )
    assert _rules(lines) == set()


def test_a_file_deleted_and_created_again_needs_its_entry_synced_again() -> None:
    lines = _trace(*_NEW_FILE, _DIR_SYNC, 'unlink("/d/st/f") = 0', *_NEW_FILE, _ACK_F)
    assert _rules(lines) == {("ACK f", "entry", "/d/st/f")}


def test_a_file_renamed_into_place_needs_its_new_directory_synced() -> None:
    for rename in ('renameat2(AT_FDCWD</d>, "tmp", AT_FDCWD</d>, "st/f", 0) = 0',
                   'rename("/d/tmp", "/d/st/f") = 0'):
        written = _trace(
            'openat(AT_FDCWD</x>, "/d/tmp", O_RDWR|O_CREAT, 0644) = 3</d/tmp>',
            'write(3</d/tmp>, "abc", 3) = 3',
            "fsync(3</d/tmp>) = 0",
        )
        assert _rules(_trace(*written, rename, _ACK_F)) == {("ACK f", "entry", "/d/st/f")}
        assert _rules(_trace(*written, _DIR_SYNC, rename, _ACK_F)) != set()
        assert _rules(_trace(*written, rename, _DIR_SYNC, _ACK_F)) == set()


def test_a_file_mapped_before_its_rename_is_msynced_under_its_new_name() -> None:
    """The mmap store builds a segment under a temporary name, maps it, and renames it into
    place; its writer's msyncs then go through the mapping made under the old name."""
    lines = _trace(
        'openat(AT_FDCWD</x>, "/d/st/f.building", O_RDWR|O_CREAT|O_EXCL, 0644) = 3'
        "</d/st/f.building>",
        "ftruncate(3</d/st/f.building>, 8192) = 0",
        "mmap(NULL, 8192, PROT_READ|PROT_WRITE, MAP_SHARED, 3</d/st/f.building>, 0) = 0x1000",
        "fsync(3</d/st/f.building>) = 0",
        'rename("/d/st/f.building", "/d/st/f") = 0',
        _DIR_SYNC,
        "msync(0x1000, 4096, MS_SYNC) = 0",
        'write(1<pipe:[1]>, "ACK f 0 100\\n", 12) = 12',
    )
    assert _rules(lines) == set()
    assert _rules([*lines[:5], *lines[6:]]) == {("ACK f 0 100", "entry", "/d/st/f")}
    assert _rules([*lines[:6], *lines[7:]]) == {("ACK f 0 100", "data", "/d/st/f")}


def test_every_new_directory_on_the_path_needs_its_parent_synced() -> None:
    lines = _trace(
        'mkdir("/d/st/a", 0777) = 0',
        'mkdirat(AT_FDCWD</d/st>, "a/b", 0777) = 0',
        'openat(AT_FDCWD</x>, "/d/st/a/b/f", O_RDWR|O_CREAT, 0644) = 3</d/st/a/b/f>',
        "fsync(5</d/st/a/b>) = 0",
        "fsync(6</d/st/a>) = 0",
        'write(1<pipe:[1]>, "ACK a/b/f\\n", 10) = 10',
    )
    assert _rules(lines) == {("ACK a/b/f", "ancestor", "/d/st/a")}
    assert _rules([*lines[:-1], f"1  {_DIR_SYNC}", lines[-1]]) == set()
    assert _rules([*lines[:-1], "1  sync() = 0", lines[-1]]) == set()


def test_a_resized_file_needs_an_fsync_not_an_msync() -> None:
    lines = _trace(
        "ftruncate(3</d/st/f>, 8192) = 0",
        "mmap(NULL, 8192, PROT_READ|PROT_WRITE, MAP_SHARED, 3</d/st/f>, 0) = 0x1000",
        "msync(0x1000, 8192, MS_SYNC) = 0",
        'write(1<pipe:[1]>, "ACK f 0 100\\n", 12) = 12',
    )
    assert _rules(lines) == {("ACK f 0 100", "size", "/d/st/f")}
    assert _rules([lines[0], "1  fdatasync(3</d/st/f>) = 0", *lines[1:]]) == set()


def test_mapped_data_must_be_covered_by_an_msync_of_that_file() -> None:
    mapped = _trace(
        "mmap(NULL, 8192, PROT_READ|PROT_WRITE, MAP_SHARED, 3</d/st/f>, 4096) = 0x1000",
        "mmap(NULL, 4096, PROT_READ|PROT_WRITE, MAP_SHARED, 4</d/st/g>, 0) = 0x9000",
    )
    ack = '1  write(1<pipe:[1]>, "ACK f 4200 4300\\n", 16) = 16'  # file bytes = map + 4096

    def rules(*between: str) -> set[tuple[str, str, str]]:
        return _rules([*mapped, *_trace(*between), ack])

    assert rules() == {("ACK f 4200 4300", "data", "/d/st/f")}
    assert rules("msync(0x1000, 204, MS_SYNC) = 0") == set()  # [4096, 4300) of f
    assert rules("msync(0x1000, 203, MS_SYNC) = 0") != set()  # one byte short
    assert rules("msync(0x1000, 204, MS_ASYNC) = 0") != set()  # only starts the write
    assert rules("msync(0x9000, 4096, MS_SYNC) = 0") != set()  # another file
    assert rules("munmap(0x1000, 8192) = 0",
                 "mmap(NULL, 8192, PROT_READ|PROT_WRITE, MAP_SHARED, 4</d/st/g>, 0) "
                 "= 0x1000",
                 "msync(0x1000, 8192, MS_SYNC) = 0") != set()  # the address now maps g


def test_each_write_call_must_be_synced_after_it_returned() -> None:
    lines = _trace(
        'pwrite64(3</d/st/f>, "abc", 3, 0) = 3',
        "fdatasync(3</d/st/f>) = 0",
        'pwrite64(3</d/st/f>, "def", 3, 3) = 3',
        _ACK_F,
    )
    assert _rules(lines) == {("ACK f", "data", "/d/st/f")}
    assert _rules([*lines[:-1], "1  fsync(3</d/st/f>) = 0", lines[-1]]) == set()


def test_only_ack_lines_written_to_stdout_are_acknowledgements() -> None:
    lines = _trace(
        *_NEW_FILE,
        'write(2<pipe:[2]>, "ACK f\\n", 6) = 6',
        'write(1<pipe:[1]>, "ACKNOWLEDGED f\\n", 15) = 15',
    )
    assert check(lines, ROOT) == (0, [])


def test_calls_join_split_lines_and_skip_what_is_not_a_call() -> None:
    lines = [
        "7  fsync(3</a> <unfinished ...>",
        "8  mkdir(\"/b\", 0777) = 0",
        "7  <... fsync resumed>) = 0",
        "8  +++ exited with 0 +++",
        "9  --- SIGCHLD {si_signo=SIGCHLD} ---",
        "9  <... write resumed>) = 4",  # began before the trace did
    ]
    assert [(c.name, c.args, c.began, c.returned) for c in calls(lines)] == [
        ("mkdir", ['"/b"', "0777"], 2, 2),
        ("fsync", ["3</a>"], 1, 3),
    ]


def test_arguments_split_at_top_level_commas_only() -> None:
    assert split_args('1</a, b>, "x, \\"y", [1, 2], {a=1, b=2}, 5') == [
        "1</a, b>", '"x, \\"y"', "[1, 2]", "{a=1, b=2}", "5",
    ]
