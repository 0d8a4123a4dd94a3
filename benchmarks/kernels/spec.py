"""Reader of the SOL-ExecBench problem layout: ``definition.json`` and ``workload.jsonl``.

A problem is a folder holding ``definition.json`` (name, op_type, axes const/var/expr,
inputs/outputs as axis names and dtypes, ``reference`` PyTorch source defining ``run``,
optional ``constraints`` and ``custom_inputs_entrypoint``) and ``workload.jsonl`` (one
workload a line: ``uuid``, var-axis values, an input descriptor per input of type random,
scalar, safetensors or custom, and an optional ``correctness`` tolerance). An optional
``sol.json`` beside them (our extension; the original ignores it) may give the FLOPs of
the operation as an expression over the axes, where counting them from the reference
would be wrong (causal attention does half the work its plain reference does).

Field names follow NVIDIA/SOL-ExecBench ``docs/definition.md`` and ``docs/workload.md``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .expressions import SpecError, evaluate_expression
from .published import load_published

__all__ = ["SpecError", "evaluate_expression"]

DTYPES = (
    "float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
    "float4_e2m1", "float4_e2m1fn_x2", "int64", "int32", "int16", "int8", "uint8", "bool",
)  # fmt: skip
INPUT_KINDS = ("random", "scalar", "safetensors", "custom")

# Defaults for a workload without its own tolerance: BENCHMARKS.md section 3.
DEFAULT_ATOL = 1e-2
DEFAULT_RTOL = 1e-2
DEFAULT_MATCHED_RATIO = 0.99


@dataclass(frozen=True, kw_only=True)
class Axis:
    """A symbolic dimension: ``const`` (``value``), ``var`` (set per workload) or ``expr``."""

    name: str
    kind: str
    value: int | None = None
    expression: str | None = None


@dataclass(frozen=True, kw_only=True)
class TensorSpec:
    """An input or output: dimensions (None for a Python scalar, [] for a 0-d tensor) and dtype.

    A dimension is an axis name or a literal number (``["B", "1"]`` or ``["B", 1]``), as
    upstream's shapes accept.
    """

    name: str
    shape: tuple[str, ...] | None
    dtype: str
    description: str = ""


@dataclass(frozen=True, kw_only=True)
class Tolerance:
    """When a workload's outputs count as correct (SOL-ExecBench ``CorrectnessSpec`` fields)."""

    max_atol: float = DEFAULT_ATOL
    max_rtol: float = DEFAULT_RTOL
    required_matched_ratio: float = DEFAULT_MATCHED_RATIO
    max_error_cap: float | None = None
    allow_negative_inf: bool = False  # -inf where the reference has -inf counts as a match


@dataclass(frozen=True, kw_only=True)
class InputSource:
    """Where one input of a workload comes from."""

    kind: str
    value: int | float | bool | None = None
    path: str | None = None
    tensor_key: str | None = None


@dataclass(frozen=True, kw_only=True)
class Workload:
    """A concrete instance of a definition: values of its var axes and a source per input."""

    uuid: str
    axes: Mapping[str, int]
    inputs: Mapping[str, InputSource]
    tolerance: Tolerance = field(default_factory=Tolerance)
    ignored: tuple[
        str, ...
    ] = ()  # what the workload gives that the definition lacks (ignored, as upstream)

    def scalars(self) -> dict[str, int | float | bool]:
        """Values of the inputs of kind ``scalar``."""
        return {name: src.value for name, src in self.inputs.items() if src.kind == "scalar"}

    @property
    def custom(self) -> bool:
        return any(src.kind == "custom" for src in self.inputs.values())


@dataclass(frozen=True, kw_only=True)
class Definition:
    """A kernel problem: its axes, tensors, reference source and optional extras."""

    name: str
    op_type: str | None
    axes: Mapping[str, Axis]
    inputs: Mapping[str, TensorSpec]
    outputs: Mapping[str, TensorSpec]
    reference: str
    description: str = ""
    constraints: tuple[str, ...] = ()
    custom_inputs_entrypoint: str | None = None

    def resolve_axes(self, values: Mapping[str, int]) -> dict[str, int]:
        """All axis values for a workload: consts, the given vars, then expressions.

        Values for axes the definition lacks are ignored (as upstream does). A constraint is
        checked only when it is an expression over axes (see ``checked_constraints``).

        Raises:
            SpecError: a var axis without a value or a failed constraint.
        """
        resolved: dict[str, int] = {}
        for axis in self.axes.values():
            if axis.kind == "const":
                resolved[axis.name] = int(axis.value)  # type: ignore[arg-type]
            elif axis.kind == "var":
                if axis.name not in values:
                    raise SpecError(
                        f"{self.name}: workload gives no value for var axis {axis.name!r}"
                    )
                resolved[axis.name] = int(values[axis.name])
        pending = {a.name: a.expression for a in self.axes.values() if a.kind == "expr"}
        while pending:  # expressions may use other expressions; resolve in dependency order
            progress = False
            for name, text in list(pending.items()):
                try:
                    value = evaluate_expression(text, resolved)  # type: ignore[arg-type]
                except SpecError:
                    continue
                resolved[name] = int(value)
                del pending[name]
                progress = True
            if not progress:
                raise SpecError(
                    f"{self.name}: cannot resolve expression axes {sorted(pending)} (unknown name or a cycle)"
                )
        for text in self.checked_constraints():
            if not evaluate_expression(text, resolved):
                raise SpecError(f"{self.name}: constraint {text!r} fails for axes {resolved}")
        return resolved

    def checked_constraints(self) -> tuple[str, ...]:
        """Constraints this reader evaluates: arithmetic and comparisons over axis names.

        Upstream never evaluates constraints; ours are checked where they can be (they
        catch a workload that breaks its own definition), and one over tensor values
        (``kv_indptr[-1].item() == total``) is documentation only, as upstream treats it.
        """
        names = {n: 1 for n in self.axes}
        checked = []
        for text in self.constraints:
            try:
                evaluate_expression(text, names)
            except SpecError:
                continue
            checked.append(text)
        return tuple(checked)

    def shape(self, spec: TensorSpec, axes: Mapping[str, int]) -> tuple[int, ...] | None:
        """The concrete shape of a tensor for resolved axes (None for a Python scalar)."""
        return None if spec.shape is None else tuple(dimension(d, axes) for d in spec.shape)


@dataclass(frozen=True, kw_only=True)
class Problem:
    """A definition with its workloads, the folder it came from and its optional FLOP formula."""

    definition: Definition
    workloads: tuple[Workload, ...]
    root: Path
    flops: str | None = None
    # Upstream's published per-workload times, where the dataset carries them: uuid ->
    # {"baseline_ms", "sol_ms"}, measured on ``published_hardware`` (see load_published).
    published: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    published_hardware: str = ""

    @property
    def name(self) -> str:
        return self.definition.name

    def workload(self, uuid: str) -> Workload:
        for w in self.workloads:
            if w.uuid == uuid:
                return w
        raise SpecError(
            f"{self.name}: no workload {uuid!r}; have {[w.uuid for w in self.workloads]}"
        )


def dimension(text: str, axes: Mapping[str, int]) -> int:
    """One dimension of a shape: an axis's value or a literal number."""
    if text in axes:
        return int(axes[text])
    return int(text)


def _literal(text: Any) -> bool:
    return (
        isinstance(text, int)
        and not isinstance(text, bool)
        or (isinstance(text, str) and text.isdigit())
    )


def _need(data: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise SpecError(f"{where}: missing required field {key!r}")
    return data[key]


def _tensor(name: str, data: Mapping[str, Any], axes: Mapping[str, Axis], where: str) -> TensorSpec:
    shape = _need(data, "shape", f"{where} tensor {name!r}")
    dtype = _need(data, "dtype", f"{where} tensor {name!r}")
    if dtype not in DTYPES:
        raise SpecError(
            f"{where} tensor {name!r}: dtype {dtype!r} is not one of {', '.join(DTYPES)}"
        )
    if shape is not None:
        if not isinstance(shape, list) or not all(isinstance(a, str) or _literal(a) for a in shape):
            raise SpecError(
                f"{where} tensor {name!r}: shape must be a list of axis names or numbers, or null, got {shape!r}"
            )
        missing = [a for a in shape if a not in axes and not _literal(a)]
        if missing:
            raise SpecError(
                f"{where} tensor {name!r}: shape names axes {missing} that are not in 'axes' (define an expr axis for expressions)"
            )
        shape = tuple(str(a) for a in shape)
    return TensorSpec(
        name=name, shape=shape, dtype=dtype, description=data.get("description") or ""
    )


def parse_definition(data: Mapping[str, Any], where: str = "definition") -> Definition:
    """Build a Definition from the parsed JSON of ``definition.json``."""
    name = _need(data, "name", where)
    axes: dict[str, Axis] = {}
    for axis_name, spec in _need(data, "axes", where).items():
        kind = _need(spec, "type", f"{where} axis {axis_name!r}")
        if kind == "const":
            axes[axis_name] = Axis(
                name=axis_name,
                kind=kind,
                value=int(_need(spec, "value", f"{where} axis {axis_name!r}")),
            )
        elif kind == "var":
            axes[axis_name] = Axis(name=axis_name, kind=kind)
        elif kind == "expr":
            text = _need(spec, "expression", f"{where} axis {axis_name!r}")
            evaluate_expression(
                text, {n: 1 for n in _need(data, "axes", where)}
            )  # syntax and names only
            axes[axis_name] = Axis(name=axis_name, kind=kind, expression=text)
        else:
            raise SpecError(f"{where} axis {axis_name!r}: type {kind!r} must be const, var or expr")
    inputs = {n: _tensor(n, s, axes, where) for n, s in _need(data, "inputs", where).items()}
    outputs = {n: _tensor(n, s, axes, where) for n, s in _need(data, "outputs", where).items()}
    reference = _need(data, "reference", where)
    if "def run(" not in reference:
        raise SpecError(f"{where}: 'reference' must define a top-level function run(...)")
    entry = data.get("custom_inputs_entrypoint")
    if entry and f"def {entry}(" not in reference:
        raise SpecError(
            f"{where}: custom_inputs_entrypoint {entry!r} is not defined in 'reference'"
        )
    return Definition(
        name=name,
        op_type=data.get("op_type"),
        axes=axes,
        inputs=inputs,
        outputs=outputs,
        reference=reference,
        description=data.get("description") or "",
        constraints=tuple(data.get("constraints") or ()),
        custom_inputs_entrypoint=entry or None,
    )


def _tolerance(data: Mapping[str, Any] | None) -> Tolerance:
    if not data:
        return Tolerance()
    aliases = {"atol": "max_atol", "rtol": "max_rtol", "matched_ratio": "required_matched_ratio"}
    known = {aliases.get(k, k): v for k, v in data.items()}
    fields = {
        k: known[k]
        for k in (
            "max_atol",
            "max_rtol",
            "required_matched_ratio",
            "max_error_cap",
            "allow_negative_inf",
        )
        if k in known and known[k] is not None
    }
    return Tolerance(**fields)


def parse_workload(
    data: Mapping[str, Any], definition: Definition, where: str = "workload"
) -> Workload:
    """Build a Workload from one parsed line of ``workload.jsonl`` and check it against its definition."""
    if "workload" in data and "uuid" not in data:  # a FlashInfer-Trace record wrapping the workload
        data = data["workload"]
    uuid = str(_need(data, "uuid", where))
    where = f"{where} {uuid}"
    sources: dict[str, InputSource] = {}
    ignored = [f"axis {a}" for a in (data.get("axes") or {}) if a not in definition.axes]
    for name, spec in (data.get("inputs") or {}).items():
        if name not in definition.inputs:  # upstream ignores inputs the definition lacks
            ignored.append(f"input {name}")
            continue
        kind = _need(spec, "type", f"{where} input {name!r}")
        if kind not in INPUT_KINDS:
            raise SpecError(
                f"{where} input {name!r}: type {kind!r} must be one of {', '.join(INPUT_KINDS)}"
            )
        if kind == "scalar":
            sources[name] = InputSource(
                kind=kind, value=_need(spec, "value", f"{where} input {name!r}")
            )
        elif kind == "safetensors":
            sources[name] = InputSource(kind=kind, path=_need(spec, "path", f"{where} input {name!r}"),
                                        tensor_key=_need(spec, "tensor_key", f"{where} input {name!r}"))  # fmt: skip
        else:
            sources[name] = InputSource(kind=kind)
    for name in definition.inputs:  # an input the workload leaves out is drawn at random
        sources.setdefault(name, InputSource(kind="random"))
    kinds = {s.kind for s in sources.values()}
    if "custom" in kinds:
        if definition.custom_inputs_entrypoint is None:
            raise SpecError(
                f"{where}: custom inputs need 'custom_inputs_entrypoint' in the definition"
            )
        if kinds - {"custom", "scalar"}:
            raise SpecError(
                f"{where}: custom inputs cannot be mixed with random or safetensors inputs"
            )
    tolerance = _tolerance(data.get("correctness") or data.get("tolerance"))
    axes = {k: v for k, v in (data.get("axes") or {}).items() if k in definition.axes}
    workload = Workload(
        uuid=uuid, axes=axes, inputs=sources, tolerance=tolerance, ignored=tuple(ignored)
    )
    definition.resolve_axes(workload.axes)  # var axes present, constraints hold
    return workload


def load_problem(root: Path | str) -> Problem:
    """Read one problem folder (``definition.json``, ``workload.jsonl``, optional ``sol.json``).

    Raises:
        SpecError: naming the file and field that is wrong.
    """
    root = Path(root).expanduser().resolve()  # absolute: sandboxed processes run in other folders
    def_path, wl_path = root / "definition.json", root / "workload.jsonl"
    if not def_path.is_file():
        raise SpecError(
            f"{root}: no definition.json; a problem folder holds definition.json and workload.jsonl"
        )
    try:
        definition = parse_definition(json.loads(def_path.read_text()), str(def_path))
    except json.JSONDecodeError as exc:
        raise SpecError(f"{def_path}: not valid JSON ({exc})") from exc
    if not wl_path.is_file():
        raise SpecError(f"{root}: no workload.jsonl next to definition.json")
    workloads = []
    for number, line in enumerate(wl_path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SpecError(f"{wl_path}:{number}: not valid JSON ({exc})") from exc
            workloads.append(parse_workload(record, definition, f"{wl_path}:{number}"))
    if not workloads:
        raise SpecError(f"{wl_path}: no workloads")
    flops = None
    if (root / "sol.json").is_file():
        flops = json.loads((root / "sol.json").read_text()).get("flops")
    published, hardware = load_published(root, wl_path)
    return Problem(definition=definition, workloads=tuple(workloads), root=root, flops=flops,
                   published=published, published_hardware=hardware)  # fmt: skip


def problem_dirs(dataset: Path | str) -> dict[str, Path]:
    """Problem folders under ``dataset`` (searched recursively), keyed by definition name."""
    dataset = Path(dataset).expanduser().resolve()
    if not dataset.is_dir():
        raise SpecError(
            f"dataset {dataset} is not a directory; point it at a folder of problem folders"
        )
    found: dict[str, Path] = {}
    for path in sorted(dataset.rglob("definition.json")):
        name = json.loads(path.read_text()).get("name") or path.parent.name
        found[name] = path.parent
    return found


def find_problem(dataset: Path | str, name: str) -> Problem:
    """Load the problem called ``name`` from a dataset folder; the error lists what exists."""
    dirs = problem_dirs(dataset)
    if name not in dirs:
        raise SpecError(
            f"problem {name!r} not found in {dataset}; available: {', '.join(sorted(dirs)) or 'none'}"
        )
    return load_problem(dirs[name])
