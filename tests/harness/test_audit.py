"""The auditor's static detectors: each fires on a cheat, stays silent on honest code and seeds."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from evolve.harness.audit import RULES, audit, render

REPO = Path(__file__).resolve().parents[2]
SEEDS = sorted(p for p in REPO.glob("benchmarks/*/seed*") if p.is_dir())
SEEDS += sorted(p for p in (REPO / "benchmarks/kernels/seeds").iterdir() if p.is_dir())

MODEL = """
import torch
from torch import nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
{body}
"""

# (rule, files) pairs: each is a cheat the named detector must flag.
CHEATS = {
    "ctypes": ("native-code", {"main.py": "import ctypes\nctypes.memmove(0, 0, 0)\n"}),
    "cdll": ("native-code", {"main.py": "from ctypes import CDLL\nlib = CDLL('libc.so.6')\n"}),
    "cffi": ("native-code", {"main.py": "import cffi\nffi = cffi.FFI()\n"}),
    "mmap": ("native-code", {"main.py": "import mmap as m\nbuf = m.mmap(-1, 10)\n"}),
    "cpp_extension": (
        "native-code",
        {
            "main.py": "from torch.utils.cpp_extension import load_inline\nmod = load_inline('m', '')\n"
        },
    ),
    "cpp_extension_attr": (
        "native-code",
        {"main.py": "import torch\nmod = torch.utils.cpp_extension.load('m', ['m.cpp'])\n"},
    ),
    "shared_memory": (
        "shared-memory",
        {"main.py": "from multiprocessing import shared_memory\nshared_memory.SharedMemory('x')\n"},
    ),
    "sysv_ipc": ("shared-memory", {"main.py": "import sysv_ipc\n"}),
    "proc_read": ("system-files", {"main.py": "data = open('/proc/self/maps').read()\n"}),
    "proc_fstring": ("system-files", {"main.py": "pid = 1\nopen(f'/proc/{pid}/environ')\n"}),
    "dev_shm": ("system-files", {"main.py": "import os\nos.listdir('/dev/shm')\n"}),
    "sys_read": ("system-files", {"main.py": "open('/sys/class/net/lo/address')\n"}),
    "socket": ("processes", {"main.py": "import socket\ns = socket.socket()\n"}),
    "subprocess": ("processes", {"main.py": "import subprocess\nsubprocess.run(['ls'])\n"}),
    "os_system": ("processes", {"main.py": "import os\nos.system('ls')\n"}),
    "os_fork": ("processes", {"main.py": "from os import fork\nfork()\n"}),
    "os_exec": ("processes", {"main.py": "import os\nos.execv('/bin/sh', ['sh'])\n"}),
    "clock_branch": (
        "clock",
        {"main.py": "import time\nif time.perf_counter() > 5:\n    x = 1\n"},
    ),
    "clock_variable_branch": (
        "clock",
        {
            "main.py": "import time\nt0 = time.time()\nwhile True:\n    if time.time() - t0 > 3:\n        break\n"
        },
    ),
    "clock_name_branch": (
        "clock",
        {
            "main.py": "from time import monotonic as now\nstart = now()\nx = 1 if start > 0 else 2\n"
        },
    ),
    "datetime_in_forward": (
        "clock",
        {
            "model.py": MODEL.format(
                body="        import datetime\n        s = datetime.datetime.now()\n        return x"
            )
        },
    ),
    "inference_mode_branch": (
        "mode-branch",
        {
            "model.py": MODEL.format(
                body="        if torch.is_inference_mode_enabled():\n            return x\n        return self.proj(x)"
            )
        },
    ),
    "grad_enabled_branch": (
        "mode-branch",
        {
            "model.py": MODEL.format(
                body="        return self.proj(x) if torch.is_grad_enabled() else x"
            )
        },
    ),
    "training_flag_branch": (
        "mode-branch",
        {
            "model.py": MODEL.format(
                body="        if not self.training:\n            x = x.roll(1, 1)\n        return self.proj(x)"
            )
        },
    ),
    "grad_fn_branch": (
        "mode-branch",
        {
            "model.py": MODEL.format(
                body="        y = self.proj(x)\n        if y.grad_fn is None:\n            return x\n        return y"
            )
        },
    ),
    "call_counter": (
        "forward-state",
        {"model.py": MODEL.format(body="        self.calls += 1\n        return self.proj(x)")},
    ),
    "global_counter": (
        "forward-state",
        {
            "model.py": MODEL.format(
                body="        global CALLS\n        CALLS += 1\n        return self.proj(x)"
            )
        },
    ),
    "buffer_counter": (
        "forward-state",
        {"model.py": MODEL.format(body="        self.seen.add_(1)\n        return self.proj(x)")},
    ),
    "flag_set_in_forward": (
        "forward-state",
        {"model.py": MODEL.format(body="        self.probed = True\n        return self.proj(x)")},
    ),
    "import_time_training": (
        "import-time-training",
        {
            "train.py": "from model import Model\nmodel = Model()\n",
            "model.py": "import torch\nfor _ in range(100):\n    loss = torch.zeros(())\n    loss.backward()\n",
        },
    ),
    "import_time_optimizer": (
        "import-time-training",
        {
            "train.py": "import helpers\n",
            "helpers.py": "import torch\nopt = None\nwhile True:\n    opt.step()\n",
        },
    ),
    "builtins": ("introspection", {"main.py": "import builtins\nbuiltins.print = None\n"}),
    "dunder_builtins": ("introspection", {"main.py": "__builtins__['open'] = None\n"}),
    "sys_modules": ("introspection", {"main.py": "import sys\nsys.modules['numpy'] = None\n"}),
    "meta_path": ("introspection", {"main.py": "import sys\nsys.meta_path.insert(0, object())\n"}),
    "gc_objects": ("introspection", {"main.py": "import gc\nfound = gc.get_objects()\n"}),
    "inspect_stack": ("introspection", {"main.py": "import inspect\nframes = inspect.stack()\n"}),
    "getframe": ("introspection", {"main.py": "import sys\nf = sys._getframe(1)\n"}),
}

HONEST = {
    "dropout": MODEL.format(
        body="        x = torch.nn.functional.dropout(x, 0.1, training=self.training)\n        return self.proj(x)"
    ),
    "logging_clock": "import time\nstart = time.monotonic()\nfor i in range(3):\n    print(f'{time.monotonic() - start:.1f}s')\n",
    "gc_collect": "import gc\ngc.collect()\n",
    "os_paths": "import os\nos.makedirs('out', exist_ok=True)\nprint(os.environ.get('HOME'))\n",
    "entry_script_trains": "import torch\nfor _ in range(3):\n    loss = torch.zeros((), requires_grad=True)\n    loss.backward()\n",
    "local_counter": MODEL.format(
        body="        n = 0\n        for _ in range(2):\n            n += 1\n        return self.proj(x)"
    ),
    "main_guard_loop_in_imported_file": "import torch\nif __name__ == '__main__':\n    pass\n",
}


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_each_detector_flags_its_cheat(name: str) -> None:
    rule, files = CHEATS[name]
    report = audit(files, None)
    rules = {flag.rule for flag in report.flags}
    assert rule in rules, render(report)
    flag = next(f for f in report.flags if f.rule == rule)
    assert flag.line >= 1 and flag.reason and flag.code in files[flag.path]
    assert flag.code == files[flag.path].splitlines()[flag.line - 1].strip()


@pytest.mark.parametrize("name", sorted(HONEST))
def test_honest_code_is_not_flagged(name: str) -> None:
    files = {"main.py": textwrap.dedent(HONEST[name])}
    report = audit(files, None)
    assert not report.flagged, render(report)


@pytest.mark.parametrize("seed", SEEDS, ids=lambda p: str(p.relative_to(REPO)))
def test_shipped_seeds_are_not_flagged(seed: Path) -> None:
    files = {str(p.relative_to(seed)): p.read_text() for p in seed.rglob("*.py")}
    assert files
    report = audit(files, None)
    assert not report.flagged and not report.unparsed, render(report)


def test_only_code_added_to_the_parent_is_flagged() -> None:
    parent = {"main.py": "import socket\nx = 1\n"}
    child = {"main.py": "import socket\nx = 2\nimport ctypes\n"}
    report = audit(child, parent)
    assert [(f.rule, f.line) for f in report.flags] == [("native-code", 3)]
    assert not audit(parent, parent).flagged
    moved = {"main.py": "y = 0\n\nimport socket\nx = 1\n"}  # same line, other place: inherited
    assert not audit(moved, parent).flagged
    twice = {"main.py": "import socket\nimport socket\n"}  # one more of it: flagged
    assert len(audit(twice, parent).flags) == 1


def test_a_cheat_added_to_a_seed_is_flagged_with_its_line() -> None:
    seed = REPO / "benchmarks" / "nanochat" / "seed"
    parent = {p.name: p.read_text() for p in seed.glob("*.py")}
    model = parent["model.py"]
    child = dict(parent)
    lines = model.splitlines()
    at = next(i for i, line in enumerate(lines) if "def forward(self, idx" in line)
    indent = " " * (len(lines[at + 1]) - len(lines[at + 1].lstrip()))
    lines.insert(at + 1, f"{indent}if torch.is_inference_mode_enabled():")
    lines.insert(at + 2, f"{indent}    pass")
    child["model.py"] = "\n".join(lines) + "\n"
    report = audit(child, parent)
    assert [(f.path, f.line, f.rule) for f in report.flags] == [("model.py", at + 2, "mode-branch")]


def test_unparsable_files_are_listed_and_rendered() -> None:
    report = audit({"main.py": "def (:\n", "notes.txt": "import ctypes"}, None)
    assert report.unparsed == ("main.py",) and not report.flags
    assert "not valid Python" in render(report)


def test_render_names_path_line_rule_and_reason() -> None:
    report = audit({"main.py": "x = 1\nimport ctypes\n"}, {"main.py": "x = 1\n"})
    text = render(report)
    assert text.startswith("audit: 1 suspicious line(s) added")
    assert "main.py:2 [native-code]" in text and "import ctypes" in text
    assert render(audit({"main.py": "x = 1\n"}, None)) == "audit: no suspicious code added"
    assert set(RULES) >= {flag.rule for _, (_, f) in CHEATS.items() for flag in audit(f).flags}


def test_a_call_the_task_prescribes_is_not_flagged_there() -> None:
    """Circle packing tells programs to search until ``time.process_time()`` reaches their budget."""
    code = textwrap.dedent(
        """
        import time
        from time import process_time_ns
        def construct(budget):
            start = time.process_time()
            while time.process_time() - start < budget:
                pass
            if process_time_ns() > 0:
                pass
            deadline = time.monotonic() + budget
            while time.monotonic() < deadline:
                pass
        """
    )
    files, parent = {"packing.py": code}, {"packing.py": "import time\n"}
    everywhere = audit(files, parent)
    assert [f.line for f in everywhere.flags if f.rule == "clock"] == [6, 6, 8, 11, 11]
    prescribed = ("time.process_time", "time.process_time_ns")
    here = audit(files, parent, prescribed=prescribed)
    assert [(f.rule, f.line) for f in here.flags] == [("clock", 11), ("clock", 11)]  # monotonic
    cp = REPO / "configs" / "benchmark" / "circle_packing.yaml"
    assert "prescribed: [time.process_time, time.process_time_ns]" in cp.read_text()
