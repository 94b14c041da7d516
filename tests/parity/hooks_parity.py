"""Fixture of loom's module-hook parity test (tests/unit/toolbox/hooks_test.cpp, [hooks][parity]).

  python hooks_parity.py OUTPUT_FILE        writes the fixture (torch.save)

A small network (fc1: Linear(16, 32), norm: LayerNorm(32), act: GELU, fc2: Linear(32, 4)) runs
one forward and backward with hooks registered through register_forward_pre_hook and
register_forward_hook: captures of fc1's output, norm's input and output, fc2's input; act's
output replaced by a forward hook (x 1.5) and fc2's input by a pre-hook (+ 0.25); two more
forward hooks on fc2, the second registered with prepend=True, recording the order they ran in,
and one registered and removed at once. Then the replacing hooks are removed and a second
forward runs. The fixture holds the weights, the input, every capture, the outputs, the
parameters' gradients and the order; loom's Hooked modules must reproduce each bit for bit.
"""

import sys

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(self.act(self.norm(self.fc1(x))))


def main(out_path):
    torch.manual_seed(3)
    net = Net()
    with torch.no_grad():  # LayerNorm's affine parameters other than ones and zeros
        net.norm.weight.uniform_(0.5, 1.5)
        net.norm.bias.uniform_(-0.1, 0.1)
    weights = {k: v.clone() for k, v in net.state_dict().items()}
    x = torch.randn(8, 16)
    captures, order = {}, []

    net.fc1.register_forward_hook(lambda m, args, out: captures.__setitem__("fc1.out",
                                                                             out.detach().clone()))
    net.norm.register_forward_pre_hook(lambda m, args: captures.__setitem__(
        "norm.in", args[0].detach().clone()))
    net.norm.register_forward_hook(lambda m, args, out: captures.__setitem__(
        "norm.out", out.detach().clone()))
    scale = net.act.register_forward_hook(lambda m, args, out: out * 1.5)
    shift = net.fc2.register_forward_pre_hook(lambda m, args: (args[0] + 0.25,))
    net.fc2.register_forward_pre_hook(lambda m, args: captures.__setitem__(
        "fc2.in", args[0].detach().clone()))
    net.fc2.register_forward_hook(lambda m, args, out: order.append("b"))
    net.fc2.register_forward_hook(lambda m, args, out: order.append("a"), prepend=True)
    net.fc2.register_forward_hook(lambda m, args, out: order.append("removed")).remove()

    out = net(x)
    out.square().mean().backward()
    grads = {name: p.grad.clone() for name, p in net.named_parameters()}
    scale.remove()
    shift.remove()
    with torch.no_grad():
        plain = net(x)

    torch.save({"model": weights, "x": x, "captures": captures, "out": out.detach(),
                "grads": grads, "plain": plain, "order": order}, out_path)
    print(f"hooks parity fixture: {len(captures)} captures, order {''.join(order)}")


if __name__ == "__main__":
    main(sys.argv[1])
