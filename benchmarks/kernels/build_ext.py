"""The sandboxed build step of a C++ solution: ``torch.utils.cpp_extension.load`` on its sources.

Run only by ``build.py`` as ``python -P -m evolve.benchmarks.kernels.build_ext``, through the
harness layer's protocol (``evolve.harness.protocol``): the job (module name, source folder,
output folder, flags) with a nonce on stdin; the verdict ``{"so": path}`` or ``{"error": ...}``
as the JSON line carrying the nonce. The compiler's output is shown (its tail) on failure.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Any

from evolve.harness.protocol import serve_job


def build(job: dict[str, Any]) -> dict[str, Any]:
    """Compile; where the library is, or the error."""
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
    print(flush=True)  # the verdict starts a line of its own
    return payload


def main() -> int:
    """Serve one build job through the harness layer's protocol."""
    serve_job(build)
    return 0


if __name__ == "__main__":
    sys.exit(main())
