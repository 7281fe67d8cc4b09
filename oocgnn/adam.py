"""Adam (Kingma & Ba, 2015) as `torch.optim.Adam` computes it, without `torch.optim.Optimizer`.

torch 2.13's `Optimizer` imports `torch._dynamo` the first time any of its methods runs (its step wrapper
and `torch._disable_dynamo` on `add_param_group`, `zero_grad` and `state_dict`): 3.3 s of a process's
start on this machine, paid again by every fresh run (`train_fresh`, the benchmarks' workers, distributed
ranks), for a compiler the training loop never uses. This is the same arithmetic, operation for operation,
as its single-tensor path (`torch/optim/adam.py: _single_tensor_adam`, the default for CPU tensors;
L2 weight decay added to the gradient, no amsgrad): the weights after any number of steps equal
`torch.optim.Adam`'s bit for bit on the CPU (a test). On CUDA, torch would take its multi-tensor path,
which rounds differently in the last bits. `state_dict` has torch's layout, so a checkpoint of either
loads into the other.
"""
from __future__ import annotations

import torch


class Adam:
    """`torch.optim.Adam(params, lr, betas, eps, weight_decay)`: `step`, `zero_grad`, `state_dict`,
    `load_state_dict`."""

    @classmethod
    def of_config(cls, params, cfg):
        """The optimizer a run of `cfg` trains with: its --lr, --adam-beta1 and --weight-decay."""
        return cls(params, lr=cfg.lr, betas=(cfg.adam_beta1, 0.999), weight_decay=cfg.weight_decay)

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        self.params = list(params)
        if not 0.0 <= lr or not 0.0 <= eps or not 0.0 <= weight_decay or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"Adam needs lr, eps, weight_decay >= 0 and betas in [0, 1): got lr={lr}, "
                             f"betas={betas}, eps={eps}, weight_decay={weight_decay}")
        self.lr, self.betas, self.eps, self.weight_decay = float(lr), tuple(map(float, betas)), float(eps), float(weight_decay)
        self.state: dict[int, dict] = {}          # parameter index -> step (a CPU scalar tensor), exp_avg, exp_avg_sq

    @torch.no_grad()
    def step(self):
        beta1, beta2 = self.betas
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            s = self.state.get(i)
            if s is None:
                s = self.state[i] = {"step": torch.tensor(0.0),
                                     "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                     "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
            grad = p.grad
            s["step"] += 1
            if self.weight_decay != 0:
                grad = grad.add(p, alpha=self.weight_decay)
            s["exp_avg"].lerp_(grad, 1 - beta1)
            s["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step = s["step"].item()
            step_size = self.lr / (1 - beta1 ** step)
            denom = (s["exp_avg_sq"].sqrt() / (1 - beta2 ** step) ** 0.5).add_(self.eps)
            p.addcdiv_(s["exp_avg"], denom, value=-step_size)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def state_dict(self) -> dict:
        group = {"lr": self.lr, "betas": self.betas, "eps": self.eps, "weight_decay": self.weight_decay,
                 "amsgrad": False, "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
                 "fused": None, "decoupled_weight_decay": False, "params": list(range(len(self.params)))}
        return {"state": {i: dict(s) for i, s in self.state.items()}, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict):
        groups = state_dict["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.params):
            raise ValueError(f"the optimizer state holds {sum(len(g['params']) for g in groups)} parameters in "
                             f"{len(groups)} group(s); this model has {len(self.params)} in one")
        g = groups[0]                             # torch's load_state_dict takes the saved hyperparameters too
        self.lr, self.betas, self.eps, self.weight_decay = float(g["lr"]), tuple(g["betas"]), float(g["eps"]), float(g["weight_decay"])
        self.state = {}
        for i, s in state_dict["state"].items():
            p = self.params[int(i)]
            self.state[int(i)] = {"step": s["step"].detach().float().cpu().clone(),
                                  "exp_avg": s["exp_avg"].detach().to(p.device, p.dtype).clone(),
                                  "exp_avg_sq": s["exp_avg_sq"].detach().to(p.device, p.dtype).clone()}
