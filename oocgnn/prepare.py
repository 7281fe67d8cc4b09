"""`oocgnn prepare`: a source (an .npz, an OGB directory, a synthetic preset) to a partitioned store on disk,
the edges sorted within `--prepare-memory` (`csrbuild`), METIS only where its copy of the graph fits, and for
`--task link` the held-out edges (`linksplit`). Imports inside the functions, as the CLI's commands do."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from .errors import UserError


def run(args):
    """`oocgnn prepare`: check the target and the arguments before the source is read, then write the store
    (and its shards) with at most `--prepare-memory` held, its temporary files beside the target."""
    from .atomicdir import temp_path
    from .datasets import parse_split
    from .partition import check_args
    from .storewrite import check_target
    out = Path(os.path.abspath(args.out))
    check_target(out, args.force)                 # before the source is read: fail fast
    method = args.partitioner
    check_args(method, 1 if args.parts is None else args.parts)
    if args.shards < 0 or (args.shards > 1 and method == "none" and (args.parts or 1) < args.shards):
        raise UserError(f"--shards {args.shards} needs at least as many partitions: give --partitioner "
                        "metis|fennel (and --parts K >= R)" if args.shards > 0 else "--shards is a count >= 0")
    if args.shards and args.feature_dtype != "float32":
        raise UserError("--shards cuts float32 stores only (the ranks' exchange moves float32 rows); drop "
                        "--feature-dtype, or prepare without --shards and train with --rank-data shared")
    if args.shards:
        from .shards import check_shards_target, shards_path
        check_shards_target(shards_path(out, args.shards), args.force)
    split = parse_split(args.split)
    edge_split = _edge_split(args)
    memory = prepare_memory(args.prepare_memory)
    work = temp_path(out, "prepare") if memory else None      # sorted edge runs, the neighbour file
    try:
        if work is not None:
            work.mkdir(parents=True)
        _prepare(args, out, method, split, edge_split, memory, work)
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)


def prepare_memory(text):
    """`--prepare-memory`: bytes the prepare may hold, its per-node arrays and the edge sort (None: sort the
    edges all in memory, for 0); auto is a quarter of this machine's RAM, at most 4 GiB."""
    from .units import parse_size
    if str(text).strip().lower() == "auto":
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return int(min(4 << 30, ram // 4))
    size = parse_size(text)
    if size and size < 1 << 20:
        raise UserError(f"--prepare-memory {text}: give at least 1MiB (or 0 to sort the edges in memory)")
    return size or None


def _edge_split(args):
    """`--task link`'s edge split: fractions, 'given', or 'default' (the source's own split if it has one, else
    `linksplit.DEFAULT_EDGE_SPLIT`); None for --task node. Refuses what a link store cannot be."""
    from .linksplit import parse_edge_split
    if args.task == "node":
        if args.edge_split is not None:
            raise UserError("--edge-split applies to --task link")
        return None
    if args.split != "given":
        raise UserError("--split cuts labelled nodes for --task node; a link store's edges are split by --edge-split")
    if args.shards:
        raise UserError("--shards cuts node-classification stores only; a link store is trained whole (train "
                        "--distributed: its ranks read the store itself, each its own edges)")
    if args.edge_split is None:
        return "default"
    return parse_edge_split(args.edge_split) or "given"


def _prepare(args, out, method, split, edge_split, memory, work):
    from .linksplit import DEFAULT_EDGE_SPLIT, hold_out
    from .mixing import default_parts
    from .csrsource import CSRSource
    from .partition import check_args, order_from_assignment, partition, peak_rss
    from .storewrite import write_store
    from .synthetic import generate
    t0 = time.perf_counter()
    if args.source == "synthetic" and args.row_normalize:
        raise UserError("--row-normalize applies to .npz sources only (synthetic features are generated as they are)")
    if args.source == "synthetic":                  # refused before the graph is made, not after
        from .csrbuild import sort_memory
        from .synthetic import preset
        cfg = preset(args.preset, seed=args.seed)
        if memory:
            sort_memory(memory, cfg.num_nodes)
        if method == "metis":
            _check_metis_fits(cfg.num_nodes, int(cfg.num_nodes * cfg.avg_degree), memory)
    bounded = {"prepare_memory": memory, "workdir": work} if memory else {}
    if args.source == "synthetic":
        data = generate(args.preset, seed=args.seed, progress=not args.quiet, **bounded)
    elif args.row_normalize:
        data = load_source(args.source, row_normalize=True, task=args.task, **bounded)
    else:
        data = load_source(args.source, task=args.task, **bounded)
    if args.task == "link" and data.task == "node":       # no split of its own: a seeded random one
        if edge_split == "given":
            raise UserError(f"{args.source} has no edge split of its own (--edge-split given); give fractions")
        data = hold_out(data, DEFAULT_EDGE_SPLIT if edge_split == "default" else edge_split, seed=args.seed,
                        workdir=work)
    elif args.task == "link" and isinstance(edge_split, tuple):
        raise UserError(f"{args.source} has its own edge split ({data.info['link']['source_split']}); "
                        "--edge-split fractions apply to sources without one (drop it, or give 'given')")
    if data.task == "link":
        link = data.info["link"]
        print(f"held out {len(data.links['val']):,} validation and {len(data.links['test']):,} test edges "
              f"({link['split']}); {data.num_edges // 2:,} training edges stay in the topology")
    t_load = time.perf_counter() - t0
    if split is not None:
        data = data.resplit(split[0], split[1], seed=args.seed, test_frac=split[2])
    parts = args.parts or (1 if method == "none" else
                           default_parts(data.num_nodes, data.num_edges, data.feat_dim))
    check_args(method, parts, data.num_nodes)
    if method == "metis":
        _check_metis_fits(data.num_nodes, data.num_edges, memory)
    order = offsets = None
    if method != "none" or parts > 1:
        assignment, report = partition(data, method, parts, seed=args.seed)
        order, offsets = order_from_assignment(assignment, parts)
        row = json.loads(report.to_json(orient="records"))[0]     # saved in meta.json, shown by `info`
        data.info["partition"] = {k: row[k] for k in ("method", "parts", "nonempty_parts", "edge_cut",
                                                      "size_balance", "train_balance", "seconds")}
        # what `partition.partitioned_store` (the notebooks) checks before reusing a store
        data.info["partition_key"] = {"method": method, "parts": int(parts), "seed": int(args.seed),
                                      "fingerprint": CSRSource.of(data).fingerprint()}
        shown = report.drop(columns=["dataset", "balance_train", "peak_rss"]).assign(
            peak_rss_mib=report.peak_rss / 2**20)
        print(shown.to_string(index=False, float_format="%.4g"))
    store = write_store(data, out, order=order, part_offsets=offsets, partitioner=method,
                        force=args.force, progress=not args.quiet, feature_dtype=args.feature_dtype)
    print(f"wrote {store} in {time.perf_counter() - t0:.1f} s "
          f"(source {t_load:.1f} s, peak RSS {peak_rss() / 2**30:.2f} GiB)")
    if args.shards:
        from .shards import write_shards
        where = write_shards(store, args.shards, force=args.force, progress=not args.quiet)
        print(f"wrote {args.shards} shards to {where} (rank r reads {where}/rank<r>; run with "
              f"`torchrun --nproc-per-node {args.shards} -m oocgnn train {where} --distributed`)")


def _check_metis_fits(num_nodes, num_edges, memory):
    """METIS only where its copy of the graph fits `--prepare-memory` (None: no bound)."""
    from .partition import metis_memory
    from .units import format_size
    need = metis_memory(num_nodes, num_edges)
    if memory and need > memory:
        raise UserError(f"METIS holds the whole graph in memory: about {format_size(need)} for {num_nodes:,} "
                        f"nodes and {num_edges:,} edges, more than --prepare-memory {format_size(memory)}; use "
                        "--partitioner fennel (it streams the lists in chunks) or raise --prepare-memory "
                        "(0: no bound)")


def load_source(path, **kw):
    """A `.npz` file -> `datasets.load_npz`; an OGB dataset dir (or its parent) -> `ogbraw.load_ogb_raw`."""
    from .datasets import NPZ_KEYS, load_npz
    from .ogbraw import _ogb_dir, load_ogb_raw
    path = Path(path)
    if path.is_file() and path.suffix == ".npz":
        both = ("name", "row_normalize", "prepare_memory", "workdir", "progress", "task")
        extra = sorted(k for k, v in kw.items() if v is not None and k not in both)
        if extra:
            raise UserError(f"{path}: option(s) {', '.join(extra)} only apply to OGB raw directories")
        return load_npz(path, name=kw.get("name"), row_normalize=bool(kw.get("row_normalize")),
                        prepare_memory=kw.get("prepare_memory"), workdir=kw.get("workdir"),
                        task=kw.get("task") or "node")
    if path.is_dir() and _ogb_dir(path) is not None:
        if kw.pop("row_normalize", None):
            raise UserError(f"{path}: --row-normalize applies to .npz sources only")
        return load_ogb_raw(path, **kw)
    what = "does not exist" if not path.exists() else "is not a recognised graph source"
    raise UserError(f"{path} {what}; accepted sources: a .npz file with keys {', '.join(NPZ_KEYS)}, "
                    f"or an OGB node- or link-property dir holding raw/edge.csv.gz or raw/data.npz (or its parent dir "
                    f"with exactly one such dataset subdirectory)")
