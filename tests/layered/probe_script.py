"""The toy trainer's harness probe (runs sandboxed in the candidate's workdir): local or short-run values as JSON.

python probe_script.py local        -> logits, loss, gradient norms, causality on fixed inputs
python probe_script.py train STEPS  -> the loss per step of STEPS training steps
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
import model  # noqa: E402  (the candidate's file)

VOCAB, T, B = 16, 12, 8


def batch(generator):
    x = torch.randint(0, VOCAB, (B, T + 1), generator=generator)
    x[:, 1::2] = (x[:, 0:-1:2] + 1) % VOCAB  # learnable: every odd token follows its predecessor
    return x[:, :-1], x[:, 1:]


def local():
    torch.manual_seed(0)
    net = model.build(VOCAB)
    inputs, targets = batch(torch.Generator().manual_seed(1))
    logits = net(inputs)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    loss.backward()
    grads = [p.grad.norm().item() if p.grad is not None else 0.0 for p in net.parameters()]
    changed = inputs.clone()
    changed[:, T // 2 :] = (changed[:, T // 2 :] + 3) % VOCAB
    with torch.no_grad():
        moved = (net(changed)[:, : T // 2] - logits[:, : T // 2].detach()).abs().max().item()
    return {
        "logits": logits.detach().tolist(),
        "loss": loss.item(),
        "grad_norm": sum(grads),
        "causality": moved,
    }


def train(steps):
    torch.manual_seed(int(os.environ.get("EVOLVE_SEED", "0")))
    net = model.build(VOCAB)
    opt = model.optimizer(net)
    generator = torch.Generator().manual_seed(int(os.environ.get("EVOLVE_SEED", "0")) + 7)
    losses = []
    for _ in range(steps):
        inputs, targets = batch(generator)
        loss = torch.nn.functional.cross_entropy(
            net(inputs).reshape(-1, VOCAB), targets.reshape(-1)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses}


if __name__ == "__main__":
    result = local() if sys.argv[1] == "local" else train(int(sys.argv[2]))
    print("PROBE " + json.dumps(result))
