"""A CSR to stream: indptr in RAM, the neighbour lists of a GraphData (arrays, or a memory-mapped neighbour
file) or of a Store (indices.bin) read row range by row range. What the partitioners, the partition cache's
fingerprint and the streaming passes over a store's topology (`topology`, `buckets`) walk."""
from __future__ import annotations

import zlib

import numpy as np

from .datasets import GraphData
from .errors import UserError
from .io import index_dtype, release_pages

CHUNK_EDGES = 1 << 22          # CSR entries read per chunk by the streaming passes (16 MiB of int32)



class CSRSource:
    """indptr in RAM, neighbour lists streamed row-range by row-range (`chunks`)."""

    def __init__(self, name, indptr, train_idx, indices=None, indices_path=None, dtype=None,
                 indices_crc=None):
        self.name, self.indptr = name, np.asarray(indptr, dtype=np.int64)
        self.num_nodes, self.num_edges = len(self.indptr) - 1, int(self.indptr[-1])
        self.train_idx = np.asarray(train_idx, dtype=np.int64)
        self._indices, self._path = indices, indices_path
        self.dtype = np.dtype(dtype or (indices.dtype if indices is not None else np.int32))
        self._indices_crc = indices_crc

    @classmethod
    def of(cls, source) -> "CSRSource":
        """The CSR of a GraphData, or of a Store (`Store.csr_source`: its neighbour file read in chunks)."""
        if isinstance(source, CSRSource):
            return source
        if hasattr(source, "csr_source"):
            return source.csr_source()
        if isinstance(source, GraphData):
            return cls(source.name, source.indptr, source.train_idx, indices=source.indices)
        raise UserError(f"cannot partition a {type(source).__name__}; pass a GraphData or a Store")

    def chunks(self, max_edges=None):
        """(lo, hi, indices of rows lo..hi-1), at most ~max_edges (default `CHUNK_EDGES`) entries each (one row
        may exceed)."""
        max_edges = CHUNK_EDGES if max_edges is None else max_edges
        lo, n = 0, self.num_nodes
        while lo < n:
            hi = int(np.searchsorted(self.indptr, self.indptr[lo] + max_edges, side="right")) - 1
            hi = min(n, max(hi, lo + 1))
            a, b = int(self.indptr[lo]), int(self.indptr[hi])
            if self._indices is not None:
                idx = self._indices[a:b]
            else:
                idx = np.fromfile(self._path, dtype=self.dtype, count=b - a, offset=a * self.dtype.itemsize)
            yield lo, hi, idx
            release_pages(self._indices)           # a memory-mapped neighbour file: read pages leave the RSS
            lo = hi

    def indices(self) -> np.ndarray:
        """All neighbour ids in RAM (METIS only)."""
        if self._indices is not None:
            return np.asarray(self._indices)
        return np.fromfile(self._path, dtype=self.dtype)

    def train_mask(self) -> np.ndarray:
        mask = np.zeros(self.num_nodes, dtype=np.bool_)
        mask[self.train_idx] = True
        return mask

    def fingerprint(self) -> str:
        """crc32 over N, E, indptr, the neighbour ids (as stored) and the training set."""
        if self._indices_crc is None:                 # chunk by chunk: the same crc, never the whole list in RAM
            crc, dtype = 0, index_dtype(self.num_nodes)
            for _, _, idx in self.chunks():
                crc = zlib.crc32(memoryview(np.ascontiguousarray(idx, dtype=dtype)).cast("B"), crc)
            self._indices_crc = crc
        crc = zlib.crc32(f"{self.num_nodes},{self.num_edges},{self._indices_crc}".encode())
        crc = zlib.crc32(memoryview(np.ascontiguousarray(self.indptr)).cast("B"), crc)
        crc = zlib.crc32(memoryview(np.ascontiguousarray(self.train_idx)).cast("B"), crc)
        return f"{crc:08x}"
