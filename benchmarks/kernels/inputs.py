"""Tensors for a workload: inputs drawn from a seed, safetensors files, outputs, the reference.

Inputs are a pure function of (workload, seed, device), made by the harness's timer (which
holds the seed) and the referee, never by the candidate's process. Random tensors follow SOL-ExecBench's ``gen_inputs``:
upstream's name-based rules first (``heuristics.py``: weights scaled by 1/sqrt(fan_in),
norm weights of one, rotary tables, masks...), else normal floats, fp8 from a normal
clamped to [-2, 2], fp4 (``float4_e2m1fn_x2``) a normal rounded to the nearest E2M1 value
and packed two to a byte along the last dimension, integers uniform in a small range.
"""

from __future__ import annotations

import importlib.util
import json
import struct
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from . import heuristics
from .spec import Definition, Problem, SpecError, TensorSpec, Workload

_MANUAL_SEED = torch.manual_seed  # captured before any candidate runs
_INT_RANGES = {
    "int8": (-128, 128),
    "int16": (-1024, 1024),
    "int32": (-1024, 1024),
    "int64": (-1024, 1024),
    "uint8": (0, 256),
}
_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}  # fmt: skip


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a SOL-ExecBench dtype name ('float4_e2m1' means the packed
    ``float4_e2m1fn_x2``, as upstream's ``dtype_str_to_torch_dtype`` maps it)."""
    alias = {"float4_e2m1": "float4_e2m1fn_x2"}.get(name, name)
    dtype = getattr(torch, alias, None)
    if not isinstance(dtype, torch.dtype):
        raise SpecError(f"dtype {name!r} is not available in torch {torch.__version__}")
    return dtype


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any parts (stable across processes, unlike ``hash``)."""
    import hashlib

    digest = hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def read_safetensors(path: Path | str) -> dict[str, torch.Tensor]:
    """Read a ``.safetensors`` file (8-byte header length, JSON header, raw little-endian data)."""
    raw = Path(path).read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    body = memoryview(raw)[8 + length :]
    tensors = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        if info["dtype"] not in _SAFETENSORS_DTYPES:
            raise SpecError(
                f"{path}: tensor {key!r} has dtype {info['dtype']}, which this reader does not support"
            )
        start, end = info["data_offsets"]
        dtype = _SAFETENSORS_DTYPES[info["dtype"]]
        flat = (
            torch.frombuffer(bytearray(body[start:end]), dtype=torch.uint8)
            if end > start
            else torch.empty(0, dtype=torch.uint8)
        )
        tensors[key] = flat.view(dtype).reshape(info["shape"]).clone()
    return tensors


def write_safetensors(path: Path | str, tensors: Mapping[str, torch.Tensor]) -> None:
    """Write tensors in the safetensors format (for fixtures and users' own workloads)."""
    names = {v: k for k, v in _SAFETENSORS_DTYPES.items()}
    header, blobs, offset = {}, [], 0
    for key, tensor in tensors.items():
        data = tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[key] = {
            "dtype": names[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def load_reference(definition: Definition, directory: Path) -> ModuleType:
    """Import the definition's reference source as a module (written to a file so inspect works)."""
    path = directory / f"_reference_{definition.name}.py"
    path.write_text(definition.reference)
    spec = importlib.util.spec_from_file_location(f"_reference_{definition.name}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if not callable(getattr(module, "run", None)):
        raise SpecError(f"{definition.name}: the reference defines no callable run()")
    return module


_FP4_GRID = (
    0.0,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
)  # E2M1 magnitudes, codes 0..7; bit 3 is the sign


def pack_fp4(values: torch.Tensor) -> torch.Tensor:
    """Round to the nearest E2M1 value and pack pairs along the last dim (low nibble first)."""
    grid = torch.tensor(_FP4_GRID, device=values.device)
    codes = (values.abs().unsqueeze(-1) - grid).abs().argmin(-1).to(torch.uint8)
    codes = codes + (values < 0).to(torch.uint8) * 8
    packed = codes[..., ::2] + codes[..., 1::2] * 16
    return packed.view(torch.float4_e2m1fn_x2)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """The float32 values of packed E2M1 pairs (last dim doubled)."""
    raw = packed.view(torch.uint8)
    codes = torch.stack((raw & 15, raw >> 4), dim=-1).flatten(-2).long()
    grid = torch.tensor(_FP4_GRID, device=packed.device)
    return grid[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)


def _random(
    spec: TensorSpec, shape: tuple[int, ...] | None, device: torch.device, gen: torch.Generator,
    sampling: bool = False,
) -> Any:  # fmt: skip
    dtype = torch_dtype(spec.dtype)
    size = () if shape is None else shape
    if shape is not None:
        made = heuristics.generate(spec.name, shape, dtype, device, gen, spec.description)
        if made is not None:
            return made
    if dtype == getattr(torch, "float4_e2m1fn_x2", None):
        return pack_fp4(torch.randn(size, dtype=torch.float32, device=device, generator=gen))
    if dtype.is_floating_point and dtype.itemsize >= 2:
        value = torch.randn(size, dtype=dtype, device=device, generator=gen)
    elif dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        value = (
            torch.randn(size, dtype=torch.float32, device=device, generator=gen)
            .clamp_(-2.0, 2.0)
            .to(dtype)
        )
    elif dtype == torch.bool:
        value = torch.randint(0, 2, size, device=device, generator=gen).bool()
    else:
        low, high = _INT_RANGES.get(spec.dtype, (0, 16))
        value = torch.randint(low, high, size, dtype=dtype, device=device, generator=gen)
    if sampling and spec.name == "probs":  # upstream: a sampling problem's probs are a softmax
        value = torch.softmax(value, dim=-1)
    return value.item() if shape is None else value


class InputMaker:
    """Makes the inputs of one workload from a seed; holds safetensors data and the custom entry point."""

    def __init__(
        self, problem: Problem, workload: Workload, device: torch.device, reference: ModuleType
    ):
        self.definition = problem.definition
        self.workload = workload
        self.device = device
        self.axes = self.definition.resolve_axes(workload.axes)
        self.files: dict[str, torch.Tensor] = {}
        for name, src in workload.inputs.items():
            if src.kind == "safetensors":
                path = _find_file(Path(src.path), problem.root)  # type: ignore[arg-type]
                if not path.is_file():
                    raise SpecError(
                        f"{self.definition.name} workload {workload.uuid}: safetensors file {path} not found"
                    )
                tensors = read_safetensors(path)
                if src.tensor_key not in tensors:
                    raise SpecError(f"{path}: no tensor {src.tensor_key!r}; has {sorted(tensors)}")
                self.files[name] = self._checked(name, tensors[src.tensor_key])
        self.custom = None
        if workload.custom:
            self.custom = getattr(reference, self.definition.custom_inputs_entrypoint or "", None)
            if not callable(self.custom):
                raise SpecError(
                    f"{self.definition.name}: reference has no function {self.definition.custom_inputs_entrypoint!r}"
                )

    def _checked(self, name: str, value: Any) -> Any:
        spec = self.definition.inputs[name]
        shape = self.definition.shape(spec, self.axes)
        if shape is None:
            if isinstance(value, torch.Tensor):
                raise SpecError(
                    f"{self.definition.name}: input {name!r} must be a Python scalar, got a tensor"
                )
            return value
        if not isinstance(value, torch.Tensor):
            raise SpecError(
                f"{self.definition.name}: input {name!r} must be a tensor, got {type(value).__name__}"
            )
        if tuple(value.shape) != shape or value.dtype != torch_dtype(spec.dtype):
            raise SpecError(
                f"{self.definition.name}: input {name!r} is {tuple(value.shape)}/{value.dtype}, "
                f"the definition says {shape}/{spec.dtype}"
            )
        return value

    def make(self, seed: int) -> list[Any]:
        """The inputs, in definition order, for ``seed``."""
        if self.custom is not None:
            _MANUAL_SEED(seed)
            made = self.custom({**self.axes, **self.workload.scalars()}, self.device)
            if not isinstance(made, Mapping):
                raise SpecError(
                    f"{self.definition.name}: custom inputs entry point must return a dict, got {type(made).__name__}"
                )
            missing = [
                n
                for n in self.definition.inputs
                if n not in made and n not in self.workload.scalars()
            ]
            if missing:
                raise SpecError(
                    f"{self.definition.name}: custom inputs entry point did not return {missing}"
                )
            return [
                self._checked(n, made[n] if n in made else self.workload.scalars()[n])
                for n in self.definition.inputs
            ]
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed)
        values = []
        for name, spec in self.definition.inputs.items():
            src = self.workload.inputs[name]
            if src.kind == "scalar":
                values.append(src.value)
            elif src.kind == "safetensors":
                values.append(self.files[name].to(self.device, copy=True))
            else:
                shape = self.definition.shape(spec, self.axes)
                sampling = self.definition.op_type == "sampling"
                values.append(_random(spec, shape, self.device, gen, sampling))
        return values

    def output_shapes(self) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """(shape, dtype) of each output; a scalar output is held in a 0-d tensor."""
        return [
            (self.definition.shape(spec, self.axes) or (), torch_dtype(spec.dtype))
            for spec in self.definition.outputs.values()
        ]

    def allocate(self, fill: float | None = float("nan")) -> list[torch.Tensor]:
        """Fresh output tensors, filled with ``fill`` (NaN by default) so stale results never pass."""
        outs = []
        for shape, dtype in self.output_shapes():
            out = torch.empty(shape, dtype=dtype, device=self.device)
            if fill is not None:
                out.fill_(fill if dtype.is_floating_point else 0)
            outs.append(out)
        return outs

    def normalize(self, result: Any) -> list[torch.Tensor]:
        """The reference's return value (tensor, tuple, list, dict or scalar) as a list in output order."""
        names = list(self.definition.outputs)
        if isinstance(result, Mapping):
            items = [result[n] for n in names]
        elif isinstance(result, Sequence) and not isinstance(result, str | torch.Tensor):
            items = list(result)
        else:
            items = [result]
        if len(items) != len(names):
            raise SpecError(
                f"{self.definition.name}: reference returned {len(items)} value(s), the definition has {len(names)} output(s)"
            )
        out = []
        for item, (_shape, dtype) in zip(items, self.output_shapes(), strict=True):
            tensor = (
                item
                if isinstance(item, torch.Tensor)
                else torch.tensor(item, dtype=dtype, device=self.device)
            )
            out.append(tensor)
        return out

    def input_bytes(self) -> int:
        """Bytes of all tensor inputs (each read once)."""
        total = 0
        for _name, spec in self.definition.inputs.items():
            shape = self.definition.shape(spec, self.axes)
            if shape is not None:
                total += _numel(shape) * _itemsize(spec.dtype)
        return total

    def output_bytes(self) -> int:
        """Bytes of all outputs (each written once)."""
        return sum(_numel(shape) * dtype.itemsize for shape, dtype in self.output_shapes())


def _find_file(path: Path, root: Path) -> Path:
    """A safetensors path as given, else relative to the problem folder or any folder above it.

    SOL-ExecBench resolves it against the dataset's root (the TraceSet); a problem folder
    sits somewhere below that root, so the folders above it are tried in turn.
    """
    if path.is_absolute():
        return path
    for base in (root, *root.parents):
        if (base / path).is_file():
            return base / path
    return root / path


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _itemsize(dtype_name: str) -> int:
    return torch_dtype(dtype_name).itemsize
