"""Compressed feature rows: the store's rows as float32, float16, or int8 with a per-column scale and offset.

F2CGT (PVLDB'24) stores compressed features so that both the disk and the cache move fewer bytes per row,
and decompresses them where they are used. Here a compressed store's `features.bin` holds the encoded rows
(`prepare --feature-dtype`); every reader, cache and buffer holds them encoded (the budget counts their
bytes), and a batch's rows are decoded after the gather: on the CPU, or on the GPU after the copy
(`runtime.Runtime.gather`). int8 is affine per column, x ≈ offset + scale · q with q in −128..127, the
scale and offset fitted to the column's range (`Codec.fit`) and kept beside the rows (`feature_codec.npy`).
Error bounds: |x − x̂| ≤ scale/2 for int8 (`Codec.max_error`); float16 rounds to 11 significant bits.
"""
from __future__ import annotations

import numpy as np

from .errors import UserError

FEATURE_DTYPES = ("float32", "float16", "int8")
CODEC_FILE = "feature_codec.npy"          # int8: [2, D] float32 (scale, offset)
FLOAT16_MAX = float(np.finfo(np.float16).max)


class Codec:
    """How a store's feature rows are encoded: `dtype` on disk and in memory, `decode` to float32."""

    def __init__(self, name="float32", scale=None, offset=None):
        if name not in FEATURE_DTYPES:
            raise UserError(f"--feature-dtype must be one of {', '.join(FEATURE_DTYPES)}; got {name!r}")
        if (name == "int8") != (scale is not None and offset is not None):
            raise ValueError("an int8 codec needs its scale and offset (and only it has them)")
        self.name, self.dtype = name, np.dtype(name)
        self.scale = None if scale is None else np.ascontiguousarray(scale, dtype=np.float32)
        self.offset = None if offset is None else np.ascontiguousarray(offset, dtype=np.float32)
        self._on = {}                          # device -> (scale, offset) tensors

    def __repr__(self):
        return f"Codec({self.name!r})"

    @property
    def identity(self) -> bool:
        return self.name == "float32"

    @property
    def torch_dtype(self):
        import torch  # torch: imported when used, not with this module
        return {"float32": torch.float32, "float16": torch.float16, "int8": torch.int8}[self.name]

    @classmethod
    def fit(cls, name, column_min, column_max) -> "Codec":
        """The codec `name` for columns ranging over [column_min, column_max] (int8's scale and offset:
        the range in 255 steps; a constant column gets scale 1 and is exact)."""
        if name != "int8":
            reach = float(np.maximum(np.abs(column_min), np.abs(column_max)).max(initial=0))
            if name == "float16" and reach > FLOAT16_MAX:
                raise UserError(f"features reach {reach:.3g}, beyond float16's {FLOAT16_MAX:.0f}: prepare them as "
                                "int8 or float32, or rescale them")
            return cls(name)
        lo, hi = np.asarray(column_min, np.float64), np.asarray(column_max, np.float64)
        span = hi - lo
        scale = np.where(span > 0, span / 255.0, 1.0)
        return cls(name, scale, lo + 128.0 * scale)

    @classmethod
    def of_store(cls, path, name) -> "Codec":
        if name != "int8":
            return cls(name)
        table = np.load(path / CODEC_FILE)
        return cls(name, table[0], table[1])

    def table(self) -> np.ndarray | None:
        """What `feature_codec.npy` holds ([2, D]: scale, offset), or None (no file)."""
        return None if self.scale is None else np.stack([self.scale, self.offset])

    def encode(self, block: np.ndarray) -> np.ndarray:
        """float32 rows -> their stored form."""
        if self.name == "int8":
            q = np.rint((block - self.offset) / self.scale)
            return np.clip(q, -128, 127).astype(np.int8)
        return np.asarray(block, dtype=self.dtype)

    def decode_np(self, rows: np.ndarray) -> np.ndarray:
        """Stored rows -> float32 (numpy)."""
        if self.name == "int8":
            return rows.astype(np.float32) * self.scale + self.offset
        return np.asarray(rows, dtype=np.float32)

    def decode(self, rows, out=None):
        """Stored rows (a tensor, on any device) -> float32 rows on the same device (into `out` if given).
        Already-float32 rows pass through: decoding is where the rows are used, once."""
        import torch  # torch: imported when used, not with this module
        if rows.dtype == torch.float32:
            return rows if out is None or out is rows else out.copy_(rows)
        if self.name == "int8":
            scale, offset = self._tables(rows.device)
            if out is None:
                out = torch.empty(rows.shape, dtype=torch.float32, device=rows.device)
            out.copy_(rows)
            return out.mul_(scale).add_(offset)
        return rows.float() if out is None else out.copy_(rows)

    def _tables(self, device):
        import torch  # torch: imported when used, not with this module
        key = str(device)
        if key not in self._on:
            self._on[key] = (torch.from_numpy(self.scale).to(device), torch.from_numpy(self.offset).to(device))
        return self._on[key]

    def max_error(self, column_min=None, column_max=None) -> np.ndarray:
        """Per-column bound on |x − decode(encode(x))|: scale/2 for int8; for float16 half a unit in the
        last place of the column's largest magnitude (`column_min`, `column_max` needed); 0 for float32."""
        if self.name == "int8":
            return self.scale / 2 * (1 + 1e-5) + 1e-7 * np.abs(self.offset)
        if self.name == "float16":
            big = np.maximum(np.abs(column_min), np.abs(column_max)).astype(np.float64)
            return np.maximum(big * 2.0 ** -11, 2.0 ** -25)
        return np.zeros(0 if column_min is None else len(column_min))


def column_range(rows_of, n, dim, rows_per_chunk):
    """(min, max) of each column over rows 0..n (read `rows_per_chunk` at a time by `rows_of(ids)`)."""
    lo, hi = np.full(dim, np.inf, np.float32), np.full(dim, -np.inf, np.float32)
    for a in range(0, n, rows_per_chunk):
        block = np.asarray(rows_of(np.arange(a, min(n, a + rows_per_chunk))), dtype=np.float32)
        np.minimum(lo, block.min(0, initial=np.inf), out=lo)
        np.maximum(hi, block.max(0, initial=-np.inf), out=hi)
    return lo, hi
