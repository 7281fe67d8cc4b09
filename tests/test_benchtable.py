"""BenchTable: a configuration that fails is a row saying why, the CSV holds every finished row after
each one (even when a later one is interrupted), and ratios with a missing side read n/a."""
import argparse
import csv
import subprocess
import sys

import pytest

from oocgnn.benchtable import BenchTable, ProcessFailed, add_csv_argument, check_process, why
from oocgnn.errors import StoreError, UserError


def _csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _raise(exc):
    def fn():
        raise exc
    return fn


def test_a_failing_configuration_is_a_row_and_the_next_one_runs(tmp_path, capsys):
    table = BenchTable(tmp_path / "t.csv")
    assert table.run("a", lambda: {"epoch_s": 2.0}, budget="1GB") is True
    assert table.run("b", _raise(UserError("policy marius needs 1.5 MiB but --memory-budget is 1 MiB")),
                     budget="1GB") is False
    assert table.run("c", _raise(ValueError("bad shape\nsecond line")), budget="1GB") is False
    assert table.run("d", lambda: {"epoch_s": 4.0}) is True
    rows = {r["config"]: r for r in _csv(tmp_path / "t.csv")}
    assert list(rows) == ["a", "b", "c", "d"]
    assert rows["a"]["status"] == "ok" and rows["a"]["epoch_s"] == "2.0" and rows["a"]["budget"] == "1GB"
    assert rows["b"]["status"] == "does not fit: policy marius needs 1.5 MiB but --memory-budget is 1 MiB"
    assert rows["b"]["budget"] == "1GB" and rows["b"]["epoch_s"] == ""
    assert rows["c"]["status"].startswith("failed: ValueError: bad shape (test_benchtable.py:")
    assert [r["config"] for r in table.failed()] == ["b", "c"]
    assert table.ok("a")["epoch_s"] == 2.0 and table.ok("b") is None and table.ok("zzz") is None
    out = capsys.readouterr().out.splitlines()               # one line per failed row, none for the others
    assert out == [f"  b: {rows['b']['status']}", f"  c: {rows['c']['status']}"]


def test_system_exit_is_a_row_but_keyboard_interrupt_stops_with_the_finished_rows_saved(tmp_path):
    path = tmp_path / "sub" / "t.csv"                         # the directory is made
    table = BenchTable(path, echo=False)
    table.run("a", lambda: {"x": 1})
    assert [r["config"] for r in _csv(path)] == ["a"]        # saved as the row ended, not at the end
    table.run("b", _raise(SystemExit("b failed (exit 1)")))
    table.run("c", _raise(SystemExit(3)))
    assert [r["status"] for r in _csv(path)] == ["ok", "failed: b failed (exit 1)", "failed: exit 3"]
    with pytest.raises(KeyboardInterrupt):
        table.run("d", _raise(KeyboardInterrupt()))
    assert [r["config"] for r in _csv(path)] == ["a", "b", "c"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["t.csv"]     # no temporary file left


def test_a_name_recorded_again_updates_its_row_and_fn_returning_none_records_nothing(tmp_path):
    table = BenchTable(tmp_path / "t.csv", columns=["reps"], echo=False)
    table.run("inmemory", lambda: {"median_s": 1.0, "reps": 1})
    table.run("inmemory", lambda: {"median_s": 3.0, "reps": 2, "stage": {"load": 0.5}, "window": (2, 9)})
    assert table.run("setup", lambda: None) is True and table.status("setup") is None
    table.run("setup", _raise(OSError("disk full")))
    rows = _csv(tmp_path / "t.csv")
    assert [r["config"] for r in rows] == ["inmemory", "setup"]
    assert list(rows[0])[:3] == ["config", "status", "reps"]
    assert rows[0]["median_s"] == "3.0" and rows[0]["reps"] == "2"
    assert rows[0]["stage"] == '{"load": 0.5}' and rows[0]["window"] == "[2, 9]"
    assert rows[1]["status"].startswith("failed: OSError: disk full")


def test_ratios_with_a_missing_side_read_n_a_with_the_reason(tmp_path):
    table = BenchTable(tmp_path / "t.csv", echo=False)
    table.run("mmap", lambda: {"epoch_s": 6.0})
    table.run("hierbatching", lambda: {"epoch_s": 2.0})
    table.run("marius", _raise(UserError("policy marius needs 1.5 MiB; the budget is 1 MiB")))
    table.run("zero", lambda: {"epoch_s": 0.0})
    assert table.ratio("mmap", "hierbatching", "epoch_s") == (3.0, "3.00x")
    assert table.ratio("mmap", "hierbatching", "epoch_s", "{:.1f}")[1] == "3.0"
    assert table.ratio("mmap", "marius", "epoch_s") == \
        (None, "n/a (marius: does not fit: policy marius needs 1.5 MiB; the budget is 1 MiB)")
    assert table.ratio("ginex", "mmap", "epoch_s") == (None, "n/a (ginex: not run)")
    assert table.ratio("mmap", "zero", "epoch_s")[0] is None
    assert table.ratio("mmap", "hierbatching", "peak_rss")[1].startswith("n/a (peak_rss of mmap")
    assert table.na("mmap", "hierbatching") == ""


def test_a_dead_subprocess_reads_as_its_exit_code_and_last_stderr_line():
    def failure(code):
        with pytest.raises(ProcessFailed) as e:
            check_process(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True))
        return why(e.value)
    assert failure("import sys; print('noise', file=sys.stderr); "
                   "sys.stderr.write('MemoryError: out of memory\\n\\n'); sys.exit(3)") == \
        "failed: exit 3: MemoryError: out of memory"
    assert failure("from oocgnn.errors import UserError; "
                   "raise UserError('policy x needs 9 MiB but --memory-budget is 1 MiB')") == \
        "does not fit: policy x needs 9 MiB but --memory-budget is 1 MiB (exit 1)"
    check_process(subprocess.run([sys.executable, "-c", "pass"], capture_output=True, text=True))
    assert why(ProcessFailed(-9, "")) == "failed: exit -9"


def test_a_refusal_does_not_fit_only_when_it_names_the_budget_and_a_broken_store_is_a_failure():
    assert why(UserError("no N_d fits a budget of 1KB")) == "does not fit: no N_d fits a budget of 1KB"
    assert why(UserError("unknown model 'x'; choose from sage")) == "refused: unknown model 'x'; choose from sage"
    assert why(StoreError("data/x: meta.json missing")).startswith("failed: StoreError: data/x: meta.json missing")


@pytest.mark.parametrize("formatter", [argparse.HelpFormatter, argparse.ArgumentDefaultsHelpFormatter])
def test_the_csv_flag_states_its_default(formatter):
    ap = argparse.ArgumentParser(formatter_class=formatter)
    add_csv_argument(ap, "bench/x.csv under --data")
    text = " ".join(ap.format_help().split())
    assert "(default bench/x.csv under --data)" in text and "None" not in text
    assert ap.parse_args([]).csv is None and ap.parse_args(["--csv", "a.csv"]).csv == "a.csv"


def test_a_csv_path_that_cannot_be_written_fails_before_any_configuration_runs(tmp_path):
    (tmp_path / "file").write_text("")
    ran = []
    with pytest.raises(OSError):
        BenchTable(tmp_path / "file" / "t.csv").run("a", lambda: ran.append(1))
    assert not ran
    BenchTable(tmp_path / "t.csv")
    assert (tmp_path / "t.csv").read_text().splitlines() == ["config,status"]     # the header from the start


def test_a_long_reason_is_cut_in_ratios_but_kept_in_its_row(tmp_path):
    from oocgnn.benchtable import BenchTable
    table = BenchTable(tmp_path / "t.csv")
    why = "refused: policy inmemory needs 28.7 GiB resident " + "x" * 200
    table.run("inmemory", lambda: (_ for _ in ()).throw(RuntimeError(why)))
    table.add("mmap", epoch_s=1.0)
    text = table.ratio("mmap", "inmemory", "epoch_s")[1]
    assert text.startswith("n/a (inmemory: ") and text.endswith("…)") and len(text) < 100
    assert why in table.status("inmemory")


def test_a_kept_table_starts_from_the_rows_its_csv_holds(tmp_path):
    """`keep`: a run of some configurations updates only theirs; the others' rows read back as written."""
    path = tmp_path / "t.csv"
    first = BenchTable(path, columns=("x",), echo=False)
    first.add("a", x=0.25, seeds=[0, 1], note="text")
    first.add("b", x=3)
    first.run("c", lambda: 1 / 0)
    again = BenchTable(path, columns=("x",), echo=False, keep=True)
    assert again.ok("a") == {"config": "a", "status": "ok", "x": 0.25, "seeds": [0, 1], "note": "text"}
    assert again.ok("b")["x"] == 3 and again.ok("b")["seeds"] is None and again.status("c").startswith("failed")
    again.add("b", x=4)
    assert [r["x"] for r in BenchTable(path, echo=False, keep=True).rows] == [0.25, 4, None]
    assert BenchTable(path, echo=False).rows == []                # without keep a table starts empty
