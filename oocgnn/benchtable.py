"""A benchmark's table that outlives its failures: one row per configuration, saved as each one ends.

A benchmark that runs for an hour must not lose the rows it finished because its last configuration
did not fit or crashed. `BenchTable.run(name, fn)` calls `fn()` and records what it returns as the
row of `name`, or, when it raises (any `Exception`, or `SystemExit`), a row whose status says why,
and the benchmark goes on. The CSV is rewritten atomically after every row, so a benchmark killed
half-way (Ctrl-C is never caught) leaves the rows it finished. Ratios whose side failed read
"n/a (<why>)" instead of raising.
"""
from __future__ import annotations

import csv
import json
import os
import traceback
from pathlib import Path

from .errors import StoreError, UserError

OK = "ok"


class ProcessFailed(Exception):
    """A configuration's subprocess exited non-zero: its exit code and the last line it wrote to stderr."""

    def __init__(self, returncode: int, stderr: str):
        lines = [ln.strip() for ln in (stderr or "").splitlines() if ln.strip()]
        self.returncode, self.last_line = returncode, (lines[-1] if lines else "")
        super().__init__(f"exit {returncode}" + (f": {self.last_line}" if self.last_line else ""))


def check_process(result):
    """Raise ProcessFailed for a finished `subprocess.run` result with a non-zero exit code."""
    if result.returncode:
        raise ProcessFailed(result.returncode, result.stderr if result.stderr is not None else "")


def why(exc: BaseException) -> str:
    """The one-line status of a failed row. The library's refusals (a UserError, or a subprocess that
    died of one) read "does not fit: ..." when they name the budget (a plan over it), else "refused:
    ..." (a bad setting); anything else "failed: ..."."""
    if isinstance(exc, UserError) and not isinstance(exc, StoreError):
        return _refusal(str(exc))
    if isinstance(exc, ProcessFailed):
        head, _, rest = exc.last_line.partition(": ")
        if head.split(".")[-1] == "UserError":        # the child's traceback ended in a refusal
            return f"{_refusal(rest)} (exit {exc.returncode})"
        return f"failed: {_line(str(exc))}"
    if isinstance(exc, SystemExit):
        return f"failed: {_line(str(exc.code)) if isinstance(exc.code, str) else f'exit {exc.code}'}"
    text = f"{type(exc).__name__}: {_line(str(exc))}" if str(exc) else type(exc).__name__
    where = traceback.extract_tb(exc.__traceback__)[-1:]            # a bug's place, the one thing kept
    return f"failed: {text}" + (f" ({Path(where[0].filename).name}:{where[0].lineno})" if where else "")


def _refusal(message: str) -> str:
    return f"{'does not fit' if 'budget' in message else 'refused'}: {_line(message)}"


def _line(text: str, limit: int = 300) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= limit else first[:limit - 3] + "..."


class BenchTable:
    """Rows keyed by configuration name, in the order they first appeared, mirrored to `csv_path`.

    Recording a name again updates its row (a configuration measured over interleaved rounds keeps
    one row). `columns` names the CSV's leading columns after the key and `status`; the others follow
    in the order they first appear. Dicts and lists are written as JSON. `keep` starts from the rows an
    existing CSV holds (numbers and JSON read back), so that a run of some configurations updates only theirs."""

    def __init__(self, csv_path, columns=(), key: str = "config", echo: bool = True, keep: bool = False):
        self.path, self.key, self.echo = Path(csv_path), key, echo
        self.columns = [key, "status", *[c for c in columns if c not in (key, "status")]]
        self._rows: dict[str, dict] = {}
        if keep and self.path.is_file():
            with open(self.path, newline="") as f:
                for row in csv.DictReader(f):
                    self._rows[row[key]] = {k: v if k in (key, "status") else _parse(v) for k, v in row.items()}
        self.save()                   # a path that cannot be written fails now, not after the first hour

    @property
    def rows(self) -> list[dict]:
        return list(self._rows.values())

    def run(self, name: str, fn, **fields) -> bool:
        """Call fn() and record the row of `name`: `fields` and the dict fn returns, status "ok"; or, when
        fn raises, `fields` and the status saying why (printed as one line). fn returning None records
        no ok row (it recorded its own with `add`). True when fn finished."""
        try:
            values = fn()
        except (Exception, SystemExit) as e:
            status = why(e)
            if self.echo:
                print(f"  {name}: {status}", flush=True)
            self.add(name, status, **fields)
            return False
        if values is not None:
            self.add(name, OK, **{**fields, **values})
        return True

    def add(self, name: str, status: str = OK, **fields) -> dict:
        """Record (or update) the row of `name` as is, and save the CSV."""
        row = self._rows.setdefault(name, {self.key: name})
        row.update(fields)
        row["status"] = status
        self.save()
        return row

    def status(self, name: str) -> str | None:
        row = self._rows.get(name)
        return row["status"] if row else None

    def ok(self, name: str) -> dict | None:
        """The row of `name` if it ran to its end, else None."""
        row = self._rows.get(name)
        return row if row and row["status"] == OK else None

    def failed(self) -> list[dict]:
        return [r for r in self._rows.values() if r["status"] != OK]

    def na(self, *names: str) -> str:
        """'n/a (NAME: why)' for the first of `names` without an ok row ('why' cut to 80 characters: the table's
        row says it whole); '' when all ran."""
        for name in names:
            if not self.ok(name):
                why = self.status(name) or "not run"
                return f"n/a ({name}: {why if len(why) <= 80 else why[:79] + '…'})"
        return ""

    def ratio(self, a: str, b: str, key: str, fmt: str = "{:.2f}x") -> tuple[float | None, str]:
        """(row a's `key` / row b's, that formatted), or (None, 'n/a (<why>)') when a side has no ok row
        or no number there."""
        if self.na(a, b):
            return None, self.na(a, b)
        x, y = self._rows[a].get(key), self._rows[b].get(key)
        if x is None or y is None or not y:
            return None, f"n/a ({key} of {a if x is None else b} is {x if x is None else y})"
        return x / y, fmt.format(x / y)

    def save(self):
        """Rewrite the CSV atomically: a temporary file beside it, then os.replace."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        columns = list(self.columns)
        for row in self._rows.values():
            columns += [c for c in row if c not in columns]
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "w", newline="") as f:
                w = csv.DictWriter(f, columns)
                w.writeheader()
                w.writerows({k: _cell(v) for k, v in row.items()} for row in self._rows.values())
            os.replace(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)


def _parse(cell: str):
    """A CSV cell back as `_cell` wrote it: None, a number, a JSON list or dict, or the text."""
    if cell == "":
        return None
    for parse in (int, float, json.loads):
        try:
            return parse(cell)
        except ValueError:
            pass
    return cell


def _cell(value):
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str)
    return "" if value is None else value


def add_csv_argument(parser, default: str):
    """--csv PATH; `default` says in --help where it goes when not given (the benchmark resolves it)."""
    # "%(default).0s" prints nothing; it only keeps ArgumentDefaultsHelpFormatter from adding "(default: None)"
    parser.add_argument("--csv", metavar="PATH", default=None,
                        help=f"the table as CSV, rewritten as each configuration ends, failed ones included "
                             f"(default {default})%(default).0s")
