"""Every setting, whatever value it is given (CLI, --config JSON, `TrainConfig.create`), is taken or
refused with one `UserError` naming it: property-based over the settings registry (hypothesis)."""
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oocgnn.cli import main
from oocgnn.config import POLICY_OPTIONS, SETTINGS, TrainConfig
from oocgnn.errors import UserError


def _kinds(name):
    return {k.strip() for k in str(SETTINGS[name][1].type).split("|")}


TYPED = [n for n in SETTINGS if _kinds(n) & {"int", "float", "bool"}]
NUMERIC = [n for n in SETTINGS if _kinds(n) & {"int", "float"}]
ANYTHING = st.one_of(st.none(), st.booleans(), st.integers(-10**15, 10**15),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                     st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _wrong_type(name, value) -> bool:
    """Whether `value` is not of setting `name`'s type (`config._typed`'s rule); a dict under a policy's
    name is that policy's options (config.json nests them: `macrobatch` is both)."""
    if name in POLICY_OPTIONS and isinstance(value, dict):
        return False
    kinds = _kinds(name)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if "int" in kinds and number and math.isfinite(value) and float(value).is_integer():
        return False
    if "float" in kinds and number and math.isfinite(value):
        return False
    if "bool" in kinds and isinstance(value, bool):
        return False
    return not ("str" in kinds and isinstance(value, str))


def test_the_registry_has_typed_settings():
    assert {"epochs", "lr", "hidden", "passes", "progress", "static_ratio"} <= set(TYPED)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(TYPED), value=ANYTHING)
def test_any_value_is_taken_or_refused_in_one_line(name, value):
    """Never another exception (a TypeError from a comparison, torch's own errors later): a UserError,
    which names the setting when the type is wrong."""
    try:
        TrainConfig.create(store="some-store", **{name: value})
    except UserError as e:
        assert "\n" not in str(e)
        if _wrong_type(name, value):
            assert name in str(e), (name, value, str(e))
        return
    assert not _wrong_type(name, value), f"{name}={value!r} was taken"


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(NUMERIC), value=st.one_of(st.integers(-10**13, 10**13), st.floats(-1e13, 1e13)))
def test_numbers_in_a_config_file_are_taken_or_refused_by_the_command(tmp_path_factory, name, value):
    """`train --config FILE.json` with any number for a numeric setting: exit 2 with one line, or the
    settings taken (checked with a store that does not exist: refused after the settings, in one line)."""
    path = tmp_path_factory.mktemp("cfg") / "c.json"
    path.write_text(json.dumps({"store": str(path.parent / "no-store"), name: value}))
    import contextlib
    import io
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["train", "--config", str(path), "--no-progress", "--out", str(path.parent / "run")])
    assert code == 2 and err.getvalue().count("\n") == 1 and "Traceback" not in err.getvalue(), err.getvalue()


@pytest.mark.parametrize("value, words", [("five", "setting epochs must be a whole number, got 'five'"),
                                          (2.5, "got 2.5"), (True, "got True")])
def test_a_config_file_of_the_wrong_type_is_one_line(tmp_path, capsys, value, words):
    (tmp_path / "c.json").write_text(json.dumps({"store": "s", "epochs": value}))
    assert main(["train", "--config", str(tmp_path / "c.json"), "--no-progress"]) == 2
    assert words in capsys.readouterr().err
