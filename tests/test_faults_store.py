"""Faults and bad input around a store: each case ends in a clear error (one line, exit 2 through the CLI,
nothing lost) or a correct result. The run's faults are in test_faults.py, the caches' in
test_faults_caches.py."""
import errno
import fcntl
import json
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

from oocgnn.errors import StoreError, UserError
from oocgnn.store import open_store
from oocgnn.storemeta import DATA_FILES, meta_checksum
from oocgnn.storewrite import write_store

from .test_faults import assert_one_line_error, oocgnn


def _cli_out(capsys, *args, cwd=None):
    """(exit code, stderr, stdout) of `oocgnn ARGS` run in this process."""
    from oocgnn.cli import main
    old = os.getcwd()
    try:
        if cwd:
            os.chdir(cwd)
        code = main([str(a) for a in args])
    finally:
        os.chdir(old)
    captured = capsys.readouterr()
    return code, captured.err.strip(), captured.out


def _cli(capsys, *args, cwd=None):
    return _cli_out(capsys, *args, cwd=cwd)[:2]


def _one_line(code, err, *words):
    assert code == 2 and err.count("\n") == 0 and "Traceback" not in err, (code, err)
    for w in words:
        assert w in err, (w, err)


@pytest.fixture
def store(tiny_data, tmp_path):
    return write_store(tiny_data, tmp_path / "s", progress=False)


def _meta(path):
    return json.loads((path / "meta.json").read_text())


def _write_meta(path, meta, restamp=True):
    if restamp:
        meta["checksum"] = meta_checksum(meta)
    (path / "meta.json").write_text(json.dumps(meta))


def _replace(path, name, arr):
    """Rewrite one .npy file and re-stamp its size and CRC32 (and meta.json's checksum): damage that
    no checksum can see, left to the invariants."""
    np.save(path / name, arr)
    meta = _meta(path)
    meta["files"][name] = {"bytes": (path / name).stat().st_size,
                           "crc32": zlib.crc32((path / name).read_bytes())}
    _write_meta(path, meta)


def _flip_keep_mtime(f, offset):
    st = os.stat(f)
    with open(f, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0xFF]))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(f).st_mtime_ns == st.st_mtime_ns and os.stat(f).st_size == st.st_size


def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# ---- --force replaces only a store; targets that are not a store's ----------------------------
PREPARE = ("prepare", "synthetic", "--preset", "tiny", "--quiet")


@pytest.mark.parametrize("force", [False, True])
def test_force_never_deletes_what_is_not_a_store(tmp_path, capsys, force):
    d = tmp_path / "D"
    d.mkdir()
    (d / "notes.txt").write_text("precious")
    code, err = _cli(capsys, *PREPARE, "--out", d, *(["--force"] if force else []))
    _one_line(code, err, "notes.txt", "not a store")
    assert (d / "notes.txt").read_text() == "precious" and os.listdir(d) == ["notes.txt"]


def test_force_refuses_a_store_with_a_foreign_file(store, capsys):
    (store.path / "notes.txt").write_text("precious")
    code, err = _cli(capsys, *PREPARE, "--out", store.path, "--force")
    _one_line(code, err, "notes.txt")
    assert (store.path / "notes.txt").read_text() == "precious"
    open_store(store.path)                              # the store is untouched


@pytest.mark.parametrize("what", ["file", "link", "subdir-named-like-a-store-file"])
def test_force_refuses_a_file_a_link_or_a_disguised_directory(tmp_path, capsys, what):
    target = tmp_path / "D"
    if what == "file":
        target.write_text("precious")
    elif what == "link":
        (tmp_path / "real").mkdir()
        (tmp_path / "real" / "x").write_text("precious")
        target.symlink_to(tmp_path / "real")
    else:
        (target / "features.bin").mkdir(parents=True)
        (target / "features.bin" / "x").write_text("precious")
    code, err = _cli(capsys, *PREPARE, "--out", target, "--force")
    _one_line(code, err, str(target))
    assert "precious" in [p.read_text() for p in tmp_path.rglob("*") if p.is_file() and not p.name.startswith(".")]


def test_an_existing_store_needs_force_and_an_empty_directory_does_not(store, tmp_path, capsys):
    before = (store.path / "labels.npy").read_bytes()
    code, err = _cli(capsys, *PREPARE, "--out", store.path)
    _one_line(code, err, "already exists", "--force")
    assert (store.path / "labels.npy").read_bytes() == before
    (tmp_path / "empty").mkdir()
    assert _cli(capsys, *PREPARE, "--out", tmp_path / "empty")[0] == 0
    assert _cli(capsys, *PREPARE, "--out", store.path, "--force")[0] == 0
    assert sorted(p.name for p in store.path.parent.iterdir() if p.name.startswith(".")) == [".empty.lock", ".s.lock"]


@pytest.mark.parametrize("out", [".", ".."])
def test_out_is_the_current_directory_or_holds_it(tmp_path, capsys, out):
    work = tmp_path / "work"
    work.mkdir()
    code, err = _cli(capsys, *PREPARE, "--out", out, "--force", cwd=work)
    _one_line(code, err, "current directory")
    assert work.is_dir()


@pytest.mark.parametrize("cmd", ["prepare", "info"])
def test_a_file_where_a_directory_is_expected(tmp_path, capsys, cmd):
    (tmp_path / "f").write_text("precious")
    args = (*PREPARE, "--out", tmp_path / "f" / "s") if cmd == "prepare" else ("info", tmp_path / "f")
    code, err = _cli(capsys, *args)
    _one_line(code, err, str(tmp_path / "f"))
    assert (tmp_path / "f").read_text() == "precious"


@pytest.mark.parametrize("fault, words", [(errno.EROFS, "Read-only file system"),
                                          (errno.ENOSPC, "No space left on device")])
def test_a_read_only_or_full_target_ends_in_one_line(tmp_path, capsys, monkeypatch, fault, words):
    """As root, mode bits do not stop writes: the system's refusal is raised where the store is written."""
    from oocgnn import storewrite as store_module
    real = store_module._CrcWriter.__init__

    def failing(self, path):
        raise OSError(fault, words, str(path))
    monkeypatch.setattr(store_module._CrcWriter, "__init__", failing)
    code, err = _cli(capsys, *PREPARE, "--out", tmp_path / "s")
    monkeypatch.setattr(store_module._CrcWriter, "__init__", real)
    _one_line(code, err, words, "features.bin")
    assert [p.name for p in tmp_path.iterdir()] == [".s.lock"], "nothing half-written is left"


# ---- killed writers and concurrent writers ------------------------------------------------------
_KILL = """
import os, sys, shutil
from oocgnn import atomicdir
from oocgnn.synthetic import generate
from oocgnn.storewrite import write_store
point = sys.argv[2]
if point == "between-renames":                  # no RENAME_EXCHANGE: killed after moving the old store aside
    atomicdir._exchange = lambda a, b: False
    rename = os.rename
    def killing(a, b):
        rename(a, b)
        if ".old-" in str(b):
            os._exit(9)
    atomicdir.os.rename = killing
elif point == "after-exchange":                 # the new store is in place, the old one not yet removed
    atomicdir.shutil.rmtree = lambda *a, **k: os._exit(9)
write_store(generate("tiny", seed=7), sys.argv[1], force=True, progress=False)
"""


def _killed_writer(path, point):
    r = subprocess.run([sys.executable, "-c", _KILL, str(path), point], capture_output=True, text=True, timeout=300)
    assert r.returncode == 9, r.stderr[-2000:]


def test_a_kill_between_the_two_renames_leaves_the_old_store_recoverable(store, capsys):
    labels = store.labels.copy()
    _killed_writer(store.path, "between-renames")
    assert not store.path.exists()
    with pytest.raises(StoreError, match=r"\.s\.old-\d+.*restores it"):
        open_store(store.path)
    code, err = _cli(capsys, *PREPARE, "--out", store.path)     # the next writer puts it back, and refuses
    _one_line(code, err.splitlines()[-1], "already exists")
    assert "restored" in err
    np.testing.assert_array_equal(open_store(store.path).labels, labels)
    assert not [p for p in store.path.parent.iterdir() if ".old-" in p.name or ".tmp-" in p.name]


def test_a_kill_after_the_exchange_leaves_the_new_store_and_a_reported_leftover(store, capsys):
    _killed_writer(store.path, "after-exchange")
    from oocgnn.synthetic import generate
    np.testing.assert_array_equal(open_store(store.path).labels, generate("tiny", seed=7).labels)
    code, err = _cli(capsys, "info", store.path)
    assert code == 0 and "oocgnn: note: .s.tmp-" in err and "killed writer" in err, err
    code, err, out = _cli_out(capsys, *PREPARE, "--out", store.path, "--force")
    assert code == 0 and "removed .s.tmp-" in err, (err, out)
    assert not [p for p in store.path.parent.iterdir() if ".tmp-" in p.name]


@pytest.mark.parametrize("kind, content, says, flags", [
    ("tmp", "features.bin", "an unfinished s left by a killed writer", ()),
    ("prepare", "run00000.npy", "the edge runs of a killed `prepare`", ("--prepare-memory", "1MiB")),
])
def test_a_leftover_of_a_dead_writer_is_reported_then_removed(store, capsys, kind, content, says, flags):
    left = store.path.parent / f".s.{kind}-{_dead_pid()}"
    left.mkdir()
    (left / content).write_bytes(b"half")
    code, err = _cli(capsys, "info", store.path)
    assert code == 0 and f"{left.name}: {says}" in err, err
    code, err, out = _cli_out(capsys, *PREPARE, "--out", store.path, "--force", *flags)
    assert code == 0 and f"removed {left.name}" in err and not left.exists(), (err, out)
    assert not [p for p in store.path.parent.iterdir() if f".{kind}-" in p.name]   # nor the writer's own


def test_two_writers_of_one_store_cannot_both_win(store, capsys):
    fd = os.open(store.path.parent / ".s.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)                  # another writer holds the store's lock
    try:
        before = (store.path / "meta.json").read_text()
        code, err = _cli(capsys, *PREPARE, "--out", store.path, "--force")
        _one_line(code, err, "another process is writing")
        assert (store.path / "meta.json").read_text() == before
    finally:
        os.close(fd)
    assert _cli(capsys, *PREPARE, "--out", store.path, "--force")[0] == 0


def test_concurrent_prepares_end_with_one_whole_store(tmp_path):
    out = tmp_path / "s"
    procs = [subprocess.Popen([sys.executable, "-m", "oocgnn", *PREPARE, "--seed", str(seed), "--out", str(out),
                               "--force"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for seed in (1, 2, 3)]
    results = [(p.wait(timeout=600), p.stderr.read()) for p in procs]
    assert any(code == 0 for code, _ in results), results
    for code, err in results:
        assert code == 0 or (code == 2 and "another process is writing" in err), (code, err)
    open_store(out, verify="full")
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


# ---- meta.json: every field checked, and a checksum ----------------------------------------------
@pytest.mark.parametrize("key", ["name", "num_nodes", "num_edges", "feat_dim", "dtype", "row_bytes", "row_stride",
                                 "index_dtype", "num_classes", "partitioner", "num_parts", "splits", "files",
                                 "checksum"])
def test_a_missing_meta_field_is_named(store, key):
    meta = _meta(store.path)
    del meta[key]
    _write_meta(store.path, meta, restamp=key != "checksum")
    with pytest.raises(StoreError, match=f"has no '{key}'"):
        open_store(store.path)


@pytest.mark.parametrize("edit, words", [
    ({"num_nodes": "300"}, "'num_nodes' is '300', not an integer"),
    ({"feat_dim": 8.0}, "'feat_dim' is 8.0, not an integer"),
    ({"num_parts": True}, "'num_parts' is True, not an integer"),
    ({"splits": [1, 2, 3]}, "'splits' is [1, 2, 3], not dict"),
    ({"num_nodes": 0}, "'num_nodes' is 0, below 1"),
    ({"num_parts": 10**9}, "parts for"),
    ({"dtype": "float64"}, "stores hold float32, float16, int8"),
    ({"dtype": "float16"}, "x 2 bytes is"),                     # float32 rows said to be float16
    ({"dtype": "int8", "row_bytes": 128, "row_stride": 128}, "lists the wrong files (missing ['feature_codec.npy']"),
    ({"feat_dim": 4, "row_bytes": 16, "row_stride": 16}, "features.bin has"),      # half the features
    ({"feat_dim": 4}, "feat_dim 4 x 4 bytes is 16"),
    ({"row_stride": 1024}, "row stride is 1024"),
    ({"index_dtype": "int64"}, "take int32"),
    ({"splits": {"train": -1, "val": 1, "test": 1}}, "splits['train'] is -1"),
    ({"splits": {"train": 10**9, "val": 1, "test": 1}}, "more than"),
    ({"files": {}}, "lists the wrong files"),
])
def test_a_bad_meta_field_is_named(store, edit, words):
    meta = {**_meta(store.path), **edit}
    _write_meta(store.path, meta)                   # re-checksummed: only the field checks can see it
    with pytest.raises(StoreError) as e:
        open_store(store.path)
    assert words in str(e.value)


def test_a_bad_file_record_is_named(store):
    meta = _meta(store.path)
    meta["files"]["labels.npy"]["crc32"] = -5
    _write_meta(store.path, meta)
    with pytest.raises(StoreError, match="bad record for labels.npy"):
        open_store(store.path)


@pytest.mark.parametrize("edit", [{"feat_dim": 4, "row_bytes": 16}, {"name": "other"}, {"num_classes": 3}])
def test_an_edited_meta_json_is_refused_by_its_checksum(store, capsys, edit):
    _write_meta(store.path, {**_meta(store.path), **edit}, restamp=False)
    code, err = _cli(capsys, "info", store.path)
    _one_line(code, err, "meta.json was edited or corrupted")
    code, err = _cli(capsys, "train", store.path, "--epochs", "1", "--no-progress", "--out", store.path.parent / "r")
    _one_line(code, err, "meta.json was edited or corrupted")


@pytest.mark.parametrize("content", ["[1, 2]", "{\"format\": \"oocgnn-store\", \"version\": \"2\"}", "\x00\x01"])
def test_a_meta_json_that_is_not_one_is_refused(store, capsys, content):
    (store.path / "meta.json").write_text(content)
    code, err = _cli(capsys, "info", store.path)
    _one_line(code, err, str(store.path))


def test_an_older_store_is_upgraded_after_a_full_check(store, capsys):
    meta = _meta(store.path)
    old = {k: v for k, v in meta.items() if k != "checksum"} | {"version": 1}
    (store.path / "meta.json").write_text(json.dumps(old))
    code, err = _cli(capsys, "info", store.path)
    _one_line(code, err, "version 1", "info --upgrade")
    _flip_keep_mtime(store.path / "features.bin", 100)       # damaged: the upgrade refuses, meta.json kept
    code, err = _cli(capsys, "info", "--upgrade", store.path)
    _one_line(code, err, "checksum mismatch in features.bin")
    assert json.loads((store.path / "meta.json").read_text()) == old
    _flip_keep_mtime(store.path / "features.bin", 100)
    code, err = _cli(capsys, "info", "--upgrade", store.path)
    assert code == 0 and "upgraded" in err
    assert open_store(store.path, verify="full").meta["version"] == 2


# ---- corruption that keeps the file's mtime -------------------------------------------------------
@pytest.mark.parametrize("name", DATA_FILES)
def test_a_flipped_byte_with_the_mtime_restored_is_seen(store, capsys, name):
    open_store(store.path)                                   # verified once: the stamp is written
    f = store.path / name
    _flip_keep_mtime(f, f.stat().st_size - 1)
    code, err = _cli(capsys, "info", store.path)
    _one_line(code, err, f"checksum mismatch in {name}")
    code, err = _cli(capsys, "train", store.path, "--epochs", "1", "--no-progress", "--out", store.path.parent / "r")
    _one_line(code, err, f"checksum mismatch in {name}")


def test_info_verify_checks_the_big_files_again(store, capsys):
    """Damage the stamp cannot see (the stamp rewritten to match): only --verify finds it."""
    open_store(store.path)
    _flip_keep_mtime(store.path / "indices.bin", 0)
    stamp = json.loads((store.path / ".verified.json").read_text())
    st = os.stat(store.path / "indices.bin")
    stamp["files"]["indices.bin"] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]
    (store.path / ".verified.json").write_text(json.dumps(stamp))
    assert _cli(capsys, "info", store.path)[0] == 0
    code, err = _cli(capsys, "info", "--verify", store.path)
    _one_line(code, err, "checksum mismatch in indices.bin")


def test_the_stamp_is_written_at_prepare_and_names_what_was_checked(store, capsys):
    assert (store.path / ".verified.json").is_file()
    code, err, out = _cli_out(capsys, "info", store.path)
    assert code == 0 and "features.bin and indices.bin checked" in out, (err, out)
    assert open_store(store.path).verified.startswith("small files now")
    assert open_store(store.path, verify="full").verified.startswith("every file now")
    assert open_store(store.path, verify=False).verified.startswith("sizes and invariants only")


# ---- semantic corruption whose checksums were re-stamped: refused by the invariants --------------
def _damage(store, what):
    p = store.path
    n, c = store.num_nodes, store.num_classes
    arr = lambda name: np.load(p / name)         # noqa: E731
    if what == "indptr-falls":
        a = arr("indptr.npy"); a[5] = a[7] + 1; _replace(p, "indptr.npy", a)
    elif what == "indptr-end":
        a = arr("indptr.npy"); a[-1] -= 1; _replace(p, "indptr.npy", a)
    elif what == "label-too-big":
        a = arr("labels.npy"); a[3] = c; _replace(p, "labels.npy", a)
    elif what == "label-below-minus-one":
        a = arr("labels.npy"); a[3] = -2; _replace(p, "labels.npy", a)
    elif what == "split-id-out-of-range":
        a = arr("train_idx.npy"); a[-1] = n; _replace(p, "train_idx.npy", a)
    elif what == "split-id-repeated":
        a = arr("train_idx.npy"); a[1] = a[0]; _replace(p, "train_idx.npy", a)
    elif what == "splits-overlap":
        a = arr("val_idx.npy"); a[0] = arr("train_idx.npy")[0]; _replace(p, "val_idx.npy", np.sort(a))
    elif what == "train-node-unlabelled":
        a = arr("labels.npy"); a[arr("train_idx.npy")[0]] = -1; _replace(p, "labels.npy", a)
    elif what == "part-offsets-fall":
        _replace(p, "part_offsets.npy", np.array([0, n // 2, n // 3, n], dtype=np.int64))
    elif what == "part-offsets-end":
        _replace(p, "part_offsets.npy", np.array([0, n // 3, n // 2, n - 1], dtype=np.int64))
    elif what == "orig-ids-not-a-permutation":
        a = arr("orig_ids.npy"); a[0] = a[1]; _replace(p, "orig_ids.npy", a)
    elif what == "pickled-array":
        np.save(p / "labels.npy", np.array([object()] * n), allow_pickle=True)
        meta = _meta(p)
        meta["files"]["labels.npy"] = {"bytes": (p / "labels.npy").stat().st_size,
                                       "crc32": zlib.crc32((p / "labels.npy").read_bytes())}
        _write_meta(p, meta)
    elif what == "neighbour-id-out-of-range":
        ids = np.fromfile(p / "indices.bin", dtype=np.int32); ids[10] = n + 5; ids.tofile(p / "indices.bin")
        meta = _meta(p)
        meta["files"]["indices.bin"]["crc32"] = zlib.crc32(ids.tobytes())
        _write_meta(p, meta)


SEMANTIC = {"indptr-falls": "indptr.npy does not rise", "indptr-end": "indptr.npy does not rise",
            "label-too-big": "labels outside -1..", "label-below-minus-one": "labels outside -1..",
            "split-id-out-of-range": "train_idx.npy is not a sorted list",
            "split-id-repeated": "train_idx.npy is not a sorted list",
            "splits-overlap": "val_idx.npy shares nodes", "train-node-unlabelled": "train_idx.npy holds unlabelled",
            "part-offsets-fall": "part_offsets.npy does not rise", "part-offsets-end": "part_offsets.npy does not rise",
            "orig-ids-not-a-permutation": "orig_ids.npy is not a permutation",
            "pickled-array": "labels.npy", "neighbour-id-out-of-range": "indices.bin holds a node id outside"}


@pytest.mark.parametrize("what", SEMANTIC)
def test_semantic_corruption_is_refused_never_a_crash(tiny_data, tmp_path, what):
    """Through the CLI in a subprocess, so a segfault or an abort would show as such, not pass."""
    n = tiny_data.num_nodes
    store = write_store(tiny_data, tmp_path / "s", part_offsets=[0, n // 3, n // 2, n], progress=False)
    _damage(store, what)
    for args in (("info", store.path), ("train", store.path, "--epochs", "1", "--no-progress",
                                        "--out", tmp_path / "r")):
        assert_one_line_error(oocgnn(*args), SEMANTIC[what])


@pytest.mark.parametrize("split, words", [("dup", "lists a node more than once"), ("overlap", "shares 1 nodes"),
                                          ("unlabelled", "have no label")])
def test_splits_a_store_cannot_hold_are_refused_at_write(tiny_data, tmp_path, split, words):
    import dataclasses
    d = tiny_data
    if split == "dup":
        d = dataclasses.replace(d, train_idx=np.r_[d.train_idx, d.train_idx[:1]])
    elif split == "overlap":
        d = dataclasses.replace(d, val_idx=np.r_[d.val_idx, d.train_idx[:1]])
    else:
        labels = d.labels.copy()
        labels[d.test_idx[0]] = -1
        d = dataclasses.replace(d, labels=labels, num_classes=d.num_classes)
    with pytest.raises(UserError, match=words):
        write_store(d, tmp_path / "s", progress=False)
    assert not (tmp_path / "s").exists()
