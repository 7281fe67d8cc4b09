"""oocgnn.adam.Adam against torch.optim.Adam (the oracle): the same weights bit for bit, state dicts that load
either way, and a training run that never imports torch._dynamo."""
import subprocess
import sys

import pytest
import torch

from oocgnn.adam import Adam


def _models(seed=0):
    torch.manual_seed(seed)
    a = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    b = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    b.load_state_dict(a.state_dict())
    return a, b


def _steps(model, opt, n, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x = torch.randn(64, 16, generator=g)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()


@pytest.mark.parametrize("weight_decay", [0.0, 5e-4])
def test_adam_equals_torchs_bit_for_bit(weight_decay):
    a, b = _models()
    _steps(a, torch.optim.Adam(a.parameters(), lr=0.01, weight_decay=weight_decay), 150, 1)
    _steps(b, Adam(b.parameters(), lr=0.01, weight_decay=weight_decay), 150, 1)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_a_parameter_without_a_gradient_keeps_its_value_and_state():
    a, b = _models()
    a[2].weight.requires_grad_(False)
    b[2].weight.requires_grad_(False)
    _steps(a, torch.optim.Adam(a.parameters(), lr=0.01), 20, 2)
    opt = Adam(b.parameters(), lr=0.01)
    _steps(b, opt, 20, 2)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert 2 not in opt.state and len(opt.state) == 3


@pytest.mark.parametrize("saved_by", ["torch", "ours"])
def test_state_dicts_load_either_way_and_resume_to_the_same_weights(saved_by):
    """A run resumed from a checkpoint of either optimizer continues as the uninterrupted one does."""
    whole, half = _models()
    _steps(whole, torch.optim.Adam(whole.parameters(), lr=0.01, weight_decay=5e-4), 30, 3)
    first = (torch.optim.Adam if saved_by == "torch" else Adam)(half.parameters(), lr=0.01, weight_decay=5e-4)
    _steps(half, first, 10, 3)
    saved = first.state_dict()
    second = (Adam if saved_by == "torch" else torch.optim.Adam)(half.parameters(), lr=0.5)
    second.load_state_dict(saved)                 # the saved lr and weight decay, not the constructor's
    g = torch.Generator().manual_seed(3)
    for _ in range(10):
        torch.randn(64, 16, generator=g)          # the batches the first ten steps used
    for _ in range(20):
        x = torch.randn(64, 16, generator=g)
        second.zero_grad()
        half(x).pow(2).mean().backward()
        second.step()
    assert all(torch.equal(p, q) for p, q in zip(whole.parameters(), half.parameters()))


def test_a_state_dict_of_another_model_is_refused():
    a, _ = _models()
    opt = Adam(a.parameters())
    with pytest.raises(ValueError, match="holds 2 parameters"):
        opt.load_state_dict(torch.optim.Adam(torch.nn.Linear(2, 2).parameters()).state_dict())


def test_training_never_imports_torch_dynamo(tmp_path):
    """torch.optim.Optimizer would import it (3.3 s of every fresh run's start)."""
    code = ("import sys; from oocgnn.synthetic import generate; from oocgnn.storewrite import write_store; "
            "from oocgnn.config import TrainConfig; from oocgnn.train import train; "
            f"write_store(generate('tiny', seed=0), {str(tmp_path / 's')!r}, progress=False); "
            f"train(TrainConfig.create(store={str(tmp_path / 's')!r}, epochs=1, max_steps=2, max_eval_nodes=50, "
            f"progress=False, out={str(tmp_path / 'r')!r})); "
            "print('dynamo' if 'torch._dynamo' in sys.modules else 'eager')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "eager"
