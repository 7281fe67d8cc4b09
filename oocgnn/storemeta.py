"""A store's meta.json (the on-disk format's record, DESIGN.md): the format's files, its checksum, and what is wrong
with its fields and their consistency (`meta_problem`), so that `store.open_store` names the first problem of a
store before it reads a byte of its data."""
from __future__ import annotations

import json
import zlib

import numpy as np

from .codec import CODEC_FILE, FEATURE_DTYPES
from .io import feature_row_stride, index_dtype
from .linksplit import HELD_OUT

FORMAT = "oocgnn-store"
VERSION = 2            # 2: meta.json carries a checksum; stamps hold ctime and inode
NPY_FILES = ("indptr", "labels", "train_idx", "val_idx", "test_idx", "part_offsets", "orig_ids")
BIG_FILES = ("features.bin", "indices.bin")
DATA_FILES = BIG_FILES + tuple(f"{n}.npy" for n in NPY_FILES)
STAMP = ".verified.json"
LINK_FILES = tuple(f"link_{k}.npy" for k in HELD_OUT + tuple(f"{s}_neg" for s in HELD_OUT))
STORE_FILES = frozenset(("meta.json", STAMP, CODEC_FILE) + DATA_FILES + LINK_FILES)
TASKS = ("node", "link")
NEGATIVES = ("none", "pairs", "targets")


def link_files(meta: dict) -> tuple:
    """The link-prediction files a store's meta.json implies (none for node classification)."""
    link = meta.get("link")
    if not isinstance(link, dict):
        return ()
    return LINK_FILES[:2] + (LINK_FILES[2:] if link.get("negatives") != "none" else ())


def meta_checksum(meta: dict) -> int:
    """CRC32 of meta.json's content without its `checksum` field (keys sorted)."""
    body = {k: v for k, v in meta.items() if k != "checksum"}
    return zlib.crc32(json.dumps(body, sort_keys=True).encode())


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def meta_problem(meta: dict) -> str | None:
    """What is wrong with a version-2 meta.json's fields and their consistency, or None."""
    fields = {"name": str, "num_nodes": int, "num_edges": int, "feat_dim": int, "dtype": str,
              "row_bytes": int, "row_stride": int, "index_dtype": str, "num_classes": int,
              "partitioner": str, "num_parts": int, "splits": dict, "files": dict, "checksum": int}
    for key, kind in fields.items():
        if key not in meta:
            return f"has no {key!r}"
        if not (is_int(meta[key]) if kind is int else isinstance(meta[key], kind)):
            return f"field {key!r} is {meta[key]!r}, not {'an integer' if kind is int else kind.__name__}"
    n, m, d = meta["num_nodes"], meta["num_edges"], meta["feat_dim"]
    task = meta.get("task", "node")
    if task not in TASKS:
        return f"says task {task!r}; stores hold {' or '.join(TASKS)}"
    if (task == "link") != ("link" in meta):
        return "has task 'link' but no 'link' record" if task == "link" else "has a 'link' record but task 'node'"
    if task == "link":
        problem = _link_problem(meta["link"], m)
        if problem:
            return problem
    classes = 1 if task == "node" else 0          # a link store may have no labels
    for key, low in (("num_nodes", 1), ("num_edges", 0), ("feat_dim", 1), ("num_classes", classes), ("num_parts", 1)):
        if meta[key] < low:
            return f"field {key!r} is {meta[key]}, below {low}"
    if meta["num_parts"] > n:
        return f"has {meta['num_parts']} parts for {n} nodes"
    if meta["dtype"] not in FEATURE_DTYPES:
        return f"says features are {meta['dtype']!r}; stores hold {', '.join(FEATURE_DTYPES)}"
    isz = np.dtype(meta["dtype"]).itemsize
    if meta["row_bytes"] != d * isz:
        return f"says rows are {meta['row_bytes']} bytes but feat_dim {d} x {isz} bytes is {d * isz}"
    if meta["row_stride"] != feature_row_stride(d * isz):
        return f"says the row stride is {meta['row_stride']} but {d * isz}-byte rows take {feature_row_stride(d * isz)}"
    if meta["index_dtype"] != np.dtype(index_dtype(n)).name:
        return f"says neighbour ids are {meta['index_dtype']!r}; {n} nodes take {np.dtype(index_dtype(n)).name}"
    splits = meta["splits"]
    for s in ("train", "val", "test"):
        if not is_int(splits.get(s)) or splits[s] < 0:
            return f"splits[{s!r}] is {splits.get(s)!r}, not a count"
    if splits["train"] + splits["val"] + splits["test"] > n:
        return f"splits hold {splits['train'] + splits['val'] + splits['test']} nodes, more than {n}"
    files = meta["files"]
    listed = set(DATA_FILES) | ({CODEC_FILE} if meta["dtype"] == "int8" else set()) | set(link_files(meta))
    if set(files) != listed:
        missing, extra = listed - set(files), set(files) - listed
        return f"lists the wrong files (missing {sorted(missing)}, unknown {sorted(extra)})"
    for name, rec in files.items():
        if not isinstance(rec, dict) or not is_int(rec.get("bytes")) or rec["bytes"] < 0 \
                or not is_int(rec.get("crc32")) or not 0 <= rec["crc32"] < 2**32:
            return f"has a bad record for {name}: {rec!r}"
    want = {"features.bin": n * meta["row_stride"], "indices.bin": m * np.dtype(meta["index_dtype"]).itemsize}
    for name, nbytes in want.items():
        if files[name]["bytes"] != nbytes:
            return f"says {name} has {files[name]['bytes']} bytes but N/E/stride imply {nbytes}"
    return None


def _link_problem(link, num_edges) -> str | None:
    """What is wrong with meta.json's `link` record, or None."""
    if not isinstance(link, dict):
        return f"has a 'link' record that is not an object: {link!r}"
    for key, low in (("train", 0), *((s, 1) for s in HELD_OUT)):
        if not is_int(link.get(key)) or link[key] < low:
            return f"link[{key!r}] is {link.get(key)!r}, not a count >= {low}"
    if 2 * link["train"] != num_edges:
        return f"says {link['train']} training edges, but the topology holds {num_edges} entries (not twice that)"
    if link.get("negatives") not in NEGATIVES:
        return f"link['negatives'] is {link.get('negatives')!r}, not one of {', '.join(NEGATIVES)}"
    for s in HELD_OUT if link["negatives"] != "none" else ():
        if not is_int(link.get(f"{s}_negatives")) or link[f"{s}_negatives"] < 1:
            return f"link[{s + '_negatives'!r}] is {link.get(s + '_negatives')!r}, not a count >= 1"
    return None
