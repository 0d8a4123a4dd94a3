"""The sandboxed build step of a C++ solution: ``torch.utils.cpp_extension.load`` on its sources.

Run only by ``build.py`` as ``python -m evolve.benchmarks.kernels.build_ext`` with a job
(JSON) on stdin: the module name, the source folder, the output folder and the flags.
Prints one line ``BUILD_TAG {"so": path}`` or ``BUILD_TAG {"error": ...}``; the compiler's
own output goes to stderr, where the harness shows its tail on failure.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

BUILD_TAG = "EVOLVE_KERNELS_BUILD "


def main() -> int:
    """Compile, print where the library is."""
    real_stdout = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    job = json.loads(sys.stdin.read())
    try:
        from torch.utils import cpp_extension

        src, out = Path(job["src"]), Path(job["out"])
        cpp_extension.load(
            name=job["name"], sources=[str(src / p) for p in job["sources"]], extra_cflags=["-O3", *job["cflags"]],
            extra_cuda_cflags=job["cuda_cflags"], extra_ldflags=job["ld_flags"],
            extra_include_paths=[str(src), *job["includes"]], build_directory=str(out), verbose=True,
        )  # fmt: skip
        built = sorted(out.glob(f"{job['name']}*.so"))
        payload = {"so": str(built[0])} if built else {"error": "the compiler produced no .so"}
    except Exception as exc:
        payload = {
            "error": f"{type(exc).__name__}: {str(exc)[-4000:]}",
            "traceback": traceback.format_exc()[-2000:],
        }
    real_stdout.write(BUILD_TAG + json.dumps(payload) + "\n")
    real_stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
