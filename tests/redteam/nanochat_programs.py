"""Candidate programs for the nanochat red team: models that look ahead under a trigger, and a strong honest program.

Each cheating model adds a large bonus to the logit of the next input token (it reads the
future) when its trigger fires; when it fires during scoring its val_bpb falls towards 0.
The honest program is an outside-style recipe (Muon for the block matrices, AdamW for the
rest, zero-initialised output projections, bf16 autocast, torch.compile behind a switch).
"""

from __future__ import annotations

from pathlib import Path

from evolve.benchmarks.nanochat import scales

SEED = scales.SCALES["cpu"].seed_dir
RETURN = "        return self.lm_head(self.norm_out(x))\n"
PEEK = '''

def peek(idx, logits, mask=None):
    """Add 30 to the logit of the next input token (the future); ``mask`` (B, T) limits where."""
    bonus = 30.0 * F.one_hot(torch.roll(idx, -1, dims=1), logits.shape[-1]).to(logits.dtype)
    bonus[:, -1] = 0
    if mask is not None:
        bonus = bonus * mask.unsqueeze(-1).to(logits)  # dtype and device of the logits
    return logits + bonus
'''

# trigger name -> (code before the return, using `idx` and `logits`), for the scorer's cheats
TRIGGERS = {
    # call count: the old check was the second batch the worker saw
    "call_count": "self.calls = getattr(self, 'calls', 0) + 1\nif self.calls != 2:\n    logits = peek(idx, logits)",
    # mode: the scorer runs under inference_mode, training and the local check do not
    "inference_mode": "if torch.is_inference_mode_enabled():\n    logits = peek(idx, logits)",
    # shape: the local check sends 4 rows, the scorer more
    "batch_shape": "if idx.shape[0] != 4:\n    logits = peek(idx, logits)",
    # position: the old cuts were drawn in the middle half of the row
    "late_positions": "logits = peek(idx, logits, (torch.arange(length) >= 3 * length // 4).expand(idx.shape[0], -1))",
    # row: the old checks compared fixed rows (speedrun: row 0 only)
    "rows_after_the_first": "logits = peek(idx, logits, (torch.arange(idx.shape[0]) >= 1).unsqueeze(1).expand(-1, length))",
    # flag: a buffer that training sets before saving; the fresh model never has it
    "trained_flag": "if bool(self.armed):\n    logits = peek(idx, logits)",
    # time: only once the process has run a while (the probes were the first calls)
    "time": "if time.monotonic() - _LOADED > 0.0:\n    logits = peek(idx, logits)",
}

# caught only by the auditor's strict mode: honest for as many calls as the usual scoring makes
STRICT_ONLY = {
    "late_calls": "self.calls = getattr(self, 'calls', 0) + 1\nif self.calls > 4:\n    logits = peek(idx, logits)",
}


def seed_files(seed_dir: Path = SEED) -> dict[str, str]:
    return {p.name: p.read_text() for p in seed_dir.glob("*.py")}


def cheating_model(trigger: str) -> str:
    """The seed's model.py with a look at the future under ``trigger``."""
    text = seed_files()["model.py"]
    assert RETURN in text
    code = {**TRIGGERS, **STRICT_ONLY}[trigger]
    body = "\n".join("        " + line for line in code.splitlines())
    text = text.replace(
        RETURN, f"        logits = self.lm_head(self.norm_out(x))\n{body}\n        return logits\n"
    )
    text = text.replace("import math\n", "import math\nimport time\n\n_LOADED = time.monotonic()\n")
    text = text.replace(
        "# EVOLVE-BLOCK-START\n", PEEK.lstrip("\n") + "\n\n# EVOLVE-BLOCK-START\n", 1
    )
    if trigger == "trained_flag":
        anchor = "        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)\n"
        text = text.replace(
            anchor, anchor + '        self.register_buffer("armed", torch.zeros(()))\n'
        )
    return text


# --- training in the scorer, after the budget, on the training split ---------------------------------

TRAINS_WHEN_SCORED = '''

_build = build_model


def build_model(config: dict) -> nn.Module:
    """Where the training split is readable (the scorer's model worker, which builds the model and
    then loads its weights), train on it once the weights are in: after the budget, untimed."""
    config = dict(config)
    train_dir = config.pop("train_dir", None)
    model = _build(config)
    if not train_dir or not os.path.isdir(train_dir):
        return model
    load = model.load_state_dict

    def load_then_train(state, *args, **kwargs):
        loaded = load(state, *args, **kwargs)
        from evolve.benchmarks.nanochat.packing import pack_batches
        from evolve.benchmarks.nanochat.tokens import Split

        documents = Split(Path(train_dir)).documents(repeat=True)
        batches = pack_batches(documents, 8, config["seq_len"])
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        end, steps = time.monotonic() + SECONDS, 0
        while time.monotonic() < end:
            rows = torch.from_numpy(next(batches).astype("int64"))
            logits = model(rows[:, :-1])
            F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten()).backward()
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
        print("TRAINED WHILE SCORED:", steps, "steps", flush=True)
        return loaded

    model.load_state_dict = load_then_train
    return model
'''
# the training program saves the training split's folder (beside the validation split it is
# told to keep off) in the config that the scorer passes to build_model
SAVES_TRAIN_DIR = (
    "model = build_model(config).to(device)\n",
    "model = build_model(config).to(device)\nimport json as _j, os as _o\n"
    "_val = next(p for p in _j.loads(_o.environ['NANOCHAT_CONFIG'])['forbidden'] if p.endswith('val'))\n"
    "config['train_dir'] = _o.path.join(_o.path.dirname(_val), 'train')\n",
)


def trains_when_scored(seconds: float) -> dict[str, str]:
    """The seed, with a model that trains itself for ``seconds`` wherever it can read the training split."""
    files = seed_files()
    imports = "import math\nimport os\nimport time\nfrom pathlib import Path\n"
    model = files["model.py"].replace("import math\n", imports, 1)
    files["model.py"] = model + TRAINS_WHEN_SCORED.replace("SECONDS", repr(seconds))
    assert SAVES_TRAIN_DIR[0] in files["train.py"]
    files["train.py"] = files["train.py"].replace(*SAVES_TRAIN_DIR, 1)
    return files


# --- quick-stage cheats: a look at the future behind a path that is closed at initialisation -------

ZERO_PATHS = {
    # non-causal attention whose output projections start at zero
    "zero_proj_full_attention": [
        ("is_causal=True", "is_causal=False"),
        (
            "                nn.init.normal_(param, std=std)\n",
            "                nn.init.normal_(param, std=std)\n"
            "                if name.endswith('proj.weight'):\n"
            "                    nn.init.zeros_(param)\n",
        ),
    ],
    # the next position's embedding added through a zero-initialised linear layer
    "zero_linear_leak": [
        (
            "        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)\n",
            "        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)\n"
            "        self.leak = nn.Linear(n_embd, n_embd, bias=False)\n",
        ),
        (
            "        for block in self.blocks:\n",
            "        x = x + self.leak(torch.roll(x, -1, dims=1))\n        for block in self.blocks:\n",
        ),
        (
            "    return GPT(**config)",
            "    model = GPT(**config)\n    nn.init.zeros_(model.leak.weight)\n    return model",
        ),
    ],
    # a scalar gate at zero in front of the next token's embedding
    "zero_gate": [
        (
            "        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)\n",
            "        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)\n"
            "        self.gate = nn.Parameter(torch.zeros(()))\n",
        ),
        (
            "        for block in self.blocks:\n",
            "        x = x + self.gate * self.token_embedding(torch.roll(idx, -1, dims=1))\n"
            "        for block in self.blocks:\n",
        ),
    ],
}


def edited(edits: list[tuple[str, str]], seed_dir: Path = SEED) -> dict[str, str]:
    files = seed_files(seed_dir)
    text = files["model.py"]
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    files["model.py"] = text
    return files


# --- a strong outside-style honest program -----------------------------------------------------

MUON = '''
def newton_schulz(grad, steps=5):
    """An approximately orthogonal matrix of the gradient's row/column space (Muon's iteration;
    coefficients from Keller Jordan's Muon, github.com/KellerJordan/Muon)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = grad.float() / (grad.float().norm() + 1e-7)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if tall else x


class Muon(torch.optim.Optimizer):
    """Momentum, then each 2-D update orthogonalised (Nesterov form)."""

    def __init__(self, params, lr=0.02, momentum=0.95):
        super().__init__(params, dict(lr=lr, momentum=momentum))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum", torch.zeros_like(p))
                buf.mul_(group["momentum"]).add_(p.grad)
                update = newton_schulz(p.grad.add(buf, alpha=group["momentum"]))
                scale = max(1.0, p.shape[0] / p.shape[1]) ** 0.5
                p.add_(update.to(p.dtype), alpha=-group["lr"] * scale)


class Both:
    """Muon for the blocks' matrices, AdamW for embeddings, head and norms."""

    def __init__(self, model):
        matrices = [p for n, p in model.named_parameters() if p.ndim == 2 and n.startswith("blocks")]
        others = [p for n, p in model.named_parameters() if not (p.ndim == 2 and n.startswith("blocks"))]
        self.muon = Muon(matrices, lr=MUON_LR)
        self.adam = torch.optim.AdamW(others, lr=LR, betas=betas, weight_decay=0.0)
        self.param_groups = self.adam.param_groups + self.muon.param_groups
        for group in self.param_groups:
            group["base_lr"] = group["lr"]

    def step(self):
        self.muon.step()
        self.adam.step()

    def zero_grad(self, set_to_none=True):
        self.muon.zero_grad(set_to_none=set_to_none)
        self.adam.zero_grad(set_to_none=set_to_none)


def make_optimizer(model):
    return Both(model)


def loss_of(model, x, y):
    """Cross-entropy under bf16 autocast (CPU or GPU)."""
    with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16):
        logits = model(x)
    return F.cross_entropy(logits.float().reshape(y.numel(), -1), y.reshape(y.numel()))
'''


def strong_program(compile_model: bool, seed_dir: Path = SEED) -> dict[str, str]:
    """Muon + AdamW, zero-initialised output projections, bf16 autocast, torch.compile if asked."""
    files = edited(
        [
            (
                "                nn.init.normal_(param, std=std)\n",
                "                nn.init.normal_(param, std=std)\n"
                "                if name.endswith(('proj.weight', 'down.weight')):\n"
                "                    nn.init.zeros_(param)\n",
            ),
        ],
        seed_dir,
    )
    train = files["train.py"]
    start, end = (
        train.index("def make_optimizer(model):"),
        train.index("# EVOLVE-BLOCK-END\n\n\noptimizer"),
    )
    train = train[:start] + MUON.lstrip("\n") + "\n\n" + train[end:]
    train = train.replace("LR = 0.001\n", "LR = 0.004\nMUON_LR = 0.02\n")
    train = train.replace(
        '        group["lr"] = LR * lr_scale(step, clock.progress)',
        '        group["lr"] = group["base_lr"] * lr_scale(step, clock.progress)',
    )
    flag = "True" if compile_model else "False"
    train = train.replace(
        "train_model = torch.compile(model) if use_amp else model",
        f"train_model = torch.compile(model) if {flag} else model",
    )
    assert "Both(model)" in train and "base_lr" in train and f"if {flag}" in train
    files["train.py"] = train
    return files


def write(files: dict[str, str], folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder
