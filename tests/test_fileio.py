"""convsweep.base.fileio: files appear whole or not at all, and canonical JSON names things stably."""
import hashlib
import json
import os
import secrets
import stat
import threading
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from convsweep.base.errors import ConvsweepError
from convsweep.base.fileio import (canonical_hash, checked_directory, remove_stale_temporaries, write_atomic,
                              write_json_atomic, write_npy_atomic)


def temporaries(directory: Path) -> list[Path]:
    return sorted(directory.glob(".*.tmp"))


@pytest.mark.parametrize("data, expected", [(b"\x00\xffbytes\n", b"\x00\xffbytes\n"),
                                            ("text \u00e9\n", "text \u00e9\n".encode())])
def test_write_atomic_writes_bytes_and_text_whole(tmp_path, data, expected):
    path = tmp_path / "sub" / "out.bin"  # the parent is created
    path_existing = tmp_path / "old.bin"
    path_existing.write_bytes(b"an older and much longer content than the new one")
    write_atomic(path, data)
    write_atomic(path_existing, data)
    assert path.read_bytes() == expected
    assert path_existing.read_bytes() == expected  # replaced, not appended to or overlaid
    assert temporaries(path.parent) == [] and temporaries(tmp_path) == []


class Unwritable:
    """Data whose write fails halfway: not bytes, so the file object refuses it."""


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old")
    with pytest.raises(TypeError):
        write_atomic(path, Unwritable())
    assert path.read_text() == "old" and temporaries(tmp_path) == []


def test_a_failed_rename_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    path.write_text("old")
    seen = []

    def failing_replace(src, dst):
        seen.append(Path(src))
        assert Path(src).read_bytes() == b"new"  # the temporary was complete when the rename failed
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk on fire"):
        write_atomic(path, "new")
    assert len(seen) == 1 and seen[0].parent == tmp_path and not seen[0].exists()
    assert path.read_text() == "old" and temporaries(tmp_path) == []


def test_two_concurrent_writers_use_different_temporaries(tmp_path, monkeypatch):
    """Both writers hold their temporary file at the same moment (a barrier before the rename),
    so a shared name would have one overwrite or delete the other's."""
    path = tmp_path / "r.json"
    real_replace = os.replace
    barrier = threading.Barrier(2, timeout=10)
    renamed = []

    def replace_together(src, dst):
        renamed.append((Path(src), Path(src).read_bytes()))
        barrier.wait()
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_together)
    payloads = [b"A" * 100_000, b"B" * 100_000]
    errors = []

    def write(data):
        try:
            write_atomic(path, data)
        except BaseException as e:  # reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(p,)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert errors == [] and not any(t.is_alive() for t in threads)
    names = [name for name, _ in renamed]
    assert len(names) == 2 and names[0] != names[1]
    for name in names:
        assert name.parent == tmp_path and name.name.startswith(".r.json.") and name.name.endswith(".tmp")
    assert sorted(data for _, data in renamed) == payloads  # each temporary held its own writer's data whole
    assert path.read_bytes() in payloads and temporaries(tmp_path) == []


@contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_get_the_mode_the_umask_gives_new_files(tmp_path, mask, mode):
    """A result file, a summary, and a file written over (an older one made private) alike; the
    directories made on the way keep the umask's default too."""
    result, summary, older = tmp_path / "runs" / "j.json", tmp_path / "summary.md", tmp_path / "report.md"
    older.write_text("old")
    older.chmod(0o600)
    with umask(mask):
        write_json_atomic(result, {"format": 3})
        write_atomic(summary, "# summary\n")
        write_atomic(older, b"new")
    assert [stat.S_IMODE(p.stat().st_mode) for p in (result, summary, older)] == [mode] * 3
    assert stat.S_IMODE(result.parent.stat().st_mode) == 0o777 & ~mask


def test_a_planted_link_at_the_temporary_name_is_not_followed(tmp_path, monkeypatch):
    """A name already taken (here a link to another file) is skipped for a fresh one, never opened."""
    target = tmp_path / "precious"
    target.write_text("keep")
    tokens = iter(["aaaa", "bbbb"])
    monkeypatch.setattr(secrets, "token_hex", lambda n: next(tokens))
    (tmp_path / ".r.json.aaaa.tmp").symlink_to(target)
    write_atomic(tmp_path / "r.json", "new")
    assert (tmp_path / "r.json").read_text() == "new" and target.read_text() == "keep"
    assert (tmp_path / ".r.json.aaaa.tmp").is_symlink()


def test_json_refuses_nan_and_writes_nothing(tmp_path):
    path = tmp_path / "r.json"
    for bad in ({"x": float("nan")}, [float("inf")], {"x": np.float64("nan")}):
        with pytest.raises(ValueError):
            write_json_atomic(path, bad)
    assert not path.exists() and temporaries(tmp_path) == []
    path.write_text("old")
    with pytest.raises(ValueError):
        write_json_atomic(path, {"x": [1.0, -float("inf")]})
    assert path.read_text() == "old"


def test_json_serializes_numpy_and_paths(tmp_path):
    rng = np.random.default_rng()
    array = rng.standard_normal((2, 3))
    obj = {"f32": np.float32(1.5), "f64": np.float64(rng.standard_normal()), "i64": np.int64(-7),
           "flag": np.bool_(True), "array": array, "ints": np.arange(4, dtype=np.int32),
           "path": Path("networks") / "lenet86.yaml"}
    path = tmp_path / "r.json"
    write_json_atomic(path, obj)
    text = path.read_text()
    assert text.endswith("\n")
    stored = json.loads(text)
    assert stored["f32"] == 1.5 and stored["f64"] == float(obj["f64"]) and stored["i64"] == -7
    assert stored["flag"] is True
    assert np.array_equal(np.array(stored["array"], dtype=np.float64), array)  # exact round trip
    assert stored["ints"] == [0, 1, 2, 3] and stored["path"] == "networks/lenet86.yaml"


def test_json_refuses_other_objects_and_writes_nothing(tmp_path):
    path = tmp_path / "r.json"
    with pytest.raises(TypeError, match="object"):
        write_json_atomic(path, {"x": object()})
    assert not path.exists() and temporaries(tmp_path) == []


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32])
def test_npy_round_trip(tmp_path, dtype):
    array = (np.random.default_rng().standard_normal((3, 4, 5)) * 100).astype(dtype)
    path = tmp_path / "a.npy"
    write_npy_atomic(path, array)
    loaded = np.load(path, allow_pickle=False)
    assert loaded.dtype == array.dtype and loaded.shape == array.shape and np.array_equal(loaded, array)
    assert temporaries(tmp_path) == []


def test_npy_refuses_object_arrays(tmp_path):
    with pytest.raises(ValueError):
        write_npy_atomic(tmp_path / "a.npy", np.array([{"a": 1}], dtype=object))
    assert list(tmp_path.iterdir()) == []


def test_remove_stale_temporaries_removes_only_that_files_temporaries(tmp_path):
    stale = [tmp_path / ".r.json.abc123.tmp", tmp_path / ".r.json.x_y.tmp"]
    kept = [tmp_path / "r.json", tmp_path / ".r.json.abc123", tmp_path / ".other.json.abc123.tmp",
            tmp_path / ".r.json2.abc.tmp", tmp_path / "r.json.abc.tmp", tmp_path / ".r.jsonx.tmp"]
    for p in stale + kept:
        p.write_text("x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / ".r.json.abc.tmp").write_text("x")  # another directory's file of the same name
    remove_stale_temporaries(tmp_path / "r.json")
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in kept) and (tmp_path / "sub" / ".r.json.abc.tmp").exists()


def test_remove_stale_temporaries_clears_what_write_atomic_leaves(tmp_path, monkeypatch):
    """The names a killed writer leaves are the ones the cleanup looks for."""
    path = tmp_path / "r.json"

    class Killed(BaseException):
        pass

    def killed(src, dst):
        raise Killed()

    monkeypatch.setattr(Path, "unlink", lambda self, missing_ok=False: None)  # killed before its cleanup ran
    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(Killed):
        write_atomic(path, b"half")
    monkeypatch.undo()
    assert len(temporaries(tmp_path)) == 1
    remove_stale_temporaries(path)
    assert temporaries(tmp_path) == [] and not path.exists()


def test_canonical_hash_ignores_key_order_and_has_a_known_value():
    a = {"b": 1, "a": [1, 2.5, "x"], "c": {"z": None, "y": True}}
    b = {"c": {"y": True, "z": None}, "a": [1, 2.5, "x"], "b": 1}
    text = '{"a":[1,2.5,"x"],"b":1,"c":{"y":true,"z":null}}'  # sorted keys, no whitespace, written by hand
    assert canonical_hash(a) == canonical_hash(b) == hashlib.sha256(text.encode()).hexdigest()
    assert canonical_hash({"a": [2.5, 1, "x"], "b": 1, "c": {"y": True, "z": None}}) != canonical_hash(a)  # list order
    assert canonical_hash({"b": 1}) != canonical_hash({"b": 1.5})


def test_canonical_hash_of_random_mappings_is_order_free():
    rng = np.random.default_rng()
    items = [(f"k{i}", float(v)) for i, v in enumerate(rng.standard_normal(20))]
    order = rng.permutation(len(items))
    shuffled = dict(items[i] for i in order)
    assert canonical_hash(dict(items)) == canonical_hash(shuffled)
    expected = hashlib.sha256(json.dumps(dict(sorted(items)), separators=(",", ":")).encode()).hexdigest()
    assert canonical_hash(shuffled) == expected


def test_stale_temporaries_of_a_name_with_glob_characters(tmp_path):
    mine, other = tmp_path / ".r[1].json.abc.tmp", tmp_path / ".r1.json.abc.tmp"
    mine.write_text("x")
    other.write_text("y")
    remove_stale_temporaries(tmp_path / "r[1].json")
    assert not mine.exists() and other.exists()


# -- where files are written: checked_directory ----------------------------------------------------------------
def foreign(link: Path, monkeypatch) -> Path:
    """`link` as if another user had made it: its owner changed where we may (root), else we are someone else."""
    if os.geteuid() == 0:
        os.lchown(link, 4242, 4242)
    else:
        monkeypatch.setattr("convsweep.base.fileio._own_uid", lambda: os.geteuid() + 1)
    return link


def test_a_directory_and_the_users_own_links_are_taken_as_named(tmp_path):
    (tmp_path / "scratch").mkdir()
    (tmp_path / "results").symlink_to(tmp_path / "scratch")  # a user's results on another disk
    assert checked_directory(tmp_path / "results" / "e" / "figures") == tmp_path / "results" / "e" / "figures"
    assert checked_directory(tmp_path / "new" / "dir") == tmp_path / "new" / "dir"
    assert not (tmp_path / "new").exists()  # checked, not made: the first file written makes it


def test_a_link_another_user_made_is_refused_on_the_way(tmp_path, monkeypatch):
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "figures"
    link.symlink_to(tmp_path / "elsewhere")
    foreign(link, monkeypatch)
    for target in (tmp_path / "figures", tmp_path / "figures" / "sub"):
        with pytest.raises(ConvsweepError, match=r"figures is a link, made by another user \(uid \d+\), to .*else"):
            checked_directory(target)


def test_below_the_results_directory_every_directory_is_one_convsweep_makes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    Path("results/e").mkdir(parents=True)
    Path("results/e/figures").symlink_to(tmp_path / "elsewhere")  # the user's own link, but where stored data names
    refused = (r"^results/e/figures is a link, a directory convsweep makes, to .*elsewhere: convsweep writes no "
               "file through it; remove it or give --out$")
    with pytest.raises(ConvsweepError, match=refused):
        checked_directory(Path("results/e/figures"), below=Path("results"))
    assert checked_directory(Path("results/e/other"), below=Path("results")) == Path("results/e/other")
    with pytest.raises(ConvsweepError, match="is not inside results"):
        checked_directory(Path("results/../etc"), below=Path("results"))
    with pytest.raises(ConvsweepError, match="is not inside results"):
        checked_directory(Path("/etc"), below=Path("results"))


def test_a_link_planted_at_the_files_name_is_replaced_never_written_through(tmp_path):
    target = tmp_path / "precious"
    target.write_text("keep me")
    (tmp_path / "report.md").symlink_to(target)
    write_atomic(tmp_path / "report.md", "# report\n")
    assert target.read_text() == "keep me"
    assert not (tmp_path / "report.md").is_symlink() and (tmp_path / "report.md").read_text() == "# report\n"
