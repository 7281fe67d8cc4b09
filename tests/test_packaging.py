"""One source of truth for the pinned stack: environment.yml repeats requirements.txt exactly."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _pins(lines):
    return sorted(l.strip() for l in lines if l.strip() and not l.strip().startswith("#"))


def test_environment_yml_lists_the_requirements_pins():
    req = _pins((REPO / "requirements.txt").read_text().splitlines())
    env = (REPO / "environment.yml").read_text().splitlines()
    start = next(i for i, l in enumerate(env) if l.strip() == "- pip:")
    pip = [l.strip()[2:] for l in env[start + 1:] if l.strip().startswith("- ")]
    assert _pins(p for p in pip if p != "-e .") == req
    assert "torch==2.13.0" in req, "torch must stay pinned (unpinned pulls CUDA wheels)"
