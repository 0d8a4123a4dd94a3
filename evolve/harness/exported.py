"""A trained language model as a pure function: exported by the candidate's code, checked and run by harness code only.

Scoring a model by calling the candidate's Python lets that Python keep memory across
batches (a model that remembers every prefix it was shown passes every probe). Here the
candidate's code runs once, in an export process (``evolve.harness.exporter``) that sees the
model's code and config only (no weights of the run, no data of any split) and ends before
scoring starts: it builds the model and writes a ``torch.export`` graph of ``model(tokens)``
for the scored batch shape (``export_model``). The scorer never imports candidate code. It
reads the graph's JSON itself (never ``torch.export.load``, which unpickles the weights and
constants it is given with ``weights_only=False``), screens it before torch parses it
(``screen``: ATen and prims operators only, no symbolic shapes, whose expressions torch parses
with ``sympy.sympify``, an ``eval``), rebuilds the program with the tensors of the checkpoint
written at the stop (``torch.load(weights_only=True)``, every parameter and persistent buffer
replaced, so the export process's weights are never scored) and checks the rebuilt graph
(``check_graph``): no custom or higher-order operator, no Python callback, no mutation of a
buffer or the input, no random operator (a generator's state is memory across calls), the
parameters and buffers exactly the checkpoint's names and shapes. What remains is a function
of the input tokens alone.

Tensor constants and non-persistent buffers come from the export process: a function of the
model's code and config alone, computed where no data and no trained weight is. An export
that loaded the final checkpoint would let a load hook (``_load_from_state_dict``) or the model
code turn rows smuggled into the checkpoint into constants trained after the stop, with no
clock (the red team's ``test_an_exporter_never_sees_the_checkpoint_so_it_cannot_train_after_the_stop``);
the benchmark also hides from it whatever the training could write.
Since the graph does not depend on the weights, a benchmark may also export while the candidate
trains, from the code and config it declares before its clock starts (nanochat's
``client.save_initial``), and use that graph when the final checkpoint's code and config are the
same bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import operator
import re
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

# torch's graph (de)serialisation takes about a second to import: a harness process started
# ahead (the exporter, the scorer) has it loaded before its job, as it has torch
from torch._export.serde.serialize import (
    _SERIALIZE_TO_TORCH_DTYPE,
    SerializedArtifact,
    deserialize,
    serialize,
)

GRAPH_FILE = "graph.json"
CONSTANTS_FILE = "constants.pt"
PREFIX = "model."
"""The candidate's model sits under this attribute of the exported module (``Scored``)."""
MAX_GRAPH_BYTES = 256 << 20
NAMESPACES = ("aten", "prims")
TARGET = re.compile(r"torch\.ops\.(aten|prims)\.[A-Za-z0-9_]+\.[A-Za-z0-9_]+|_operator\.getitem")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
OUTSIDE = {"from_file", "save", "_print", "warn"}
"""ATen operators that reach outside the tensors (files, the log): no model needs them."""
SCALAR_READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default}
INPUT_KINDS = {"parameter", "buffer", "tensor_constant", "user_input"}
FIX = "a scored model must be a pure function of its input tokens"


class ExportRejected(Exception):
    """The model cannot be scored as a pure function; the message names the fix."""


class Scored(nn.Module):
    """What is exported: ``model(tokens)``'s logits over the first ``vocab`` columns, in float32
    (under bf16 autocast when ``autocast``, as training on a GPU runs)."""

    def __init__(self, model: nn.Module, vocab: int, autocast: bool) -> None:
        super().__init__()
        self.model = model
        self.vocab = vocab
        self.autocast = autocast

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", torch.bfloat16, enabled=self.autocast):
            logits = self.model(tokens)
        if not isinstance(logits, torch.Tensor):
            raise ExportRejected(
                f"model(inputs) must return a tensor of logits, got {type(logits).__name__}"
            )
        return logits[..., : self.vocab].float()


def export_model(
    model: nn.Module, out_dir: Path, *, rows: int, seq: int, vocab: int, device: str
) -> dict:
    """Export ``model`` (weights loaded, on ``device``) for (rows, seq) int64 tokens into ``out_dir``.

    Writes ``GRAPH_FILE`` (the graph, torch's JSON schema, no weights) and ``CONSTANTS_FILE``
    (tensor constants and non-persistent buffers); raises ExportRejected naming the fix.
    Returns the graph's operator counts.
    """
    tokens = torch.randint(0, vocab, (rows, seq), device=device)
    scored = Scored(model.eval(), vocab, autocast=device.startswith("cuda"))
    try:
        with torch.no_grad():
            program = torch.export.export(scored, (tokens,), strict=False)
        program = program.run_decompositions({})
    except ExportRejected:
        raise
    except Exception as exc:  # the candidate's forward, traced: any failure is its
        raise ExportRejected(
            f"torch.export could not trace model(inputs): {type(exc).__name__}: {str(exc)[:1500]}; "
            f"{FIX}: no Python-side state, no data-dependent Python control flow (.item(), "
            ".tolist(), a dict keyed by tokens), plain PyTorch operators (torch.export.export "
            "must succeed on the model in eval mode)"
        ) from exc
    check_graph(program)
    constants = {}
    for name, value in program.constants.items():
        if not isinstance(value, torch.Tensor):
            raise ExportRejected(
                f"the model holds a non-tensor constant {name!r} ({type(value).__name__}); "
                f"{FIX}: keep only tensors on the model"
            )
        constants[name] = value.detach().cpu().contiguous()
    artifact = serialize(program)
    (out_dir / GRAPH_FILE).write_bytes(artifact.exported_program)
    torch.save(constants, out_dir / CONSTANTS_FILE)
    counts: dict[str, int] = {}
    for node in program.graph.nodes:
        if node.op == "call_function":
            counts[str(node.target)] = counts.get(str(node.target), 0) + 1
    return counts


def _walk(value: object, path: str = ""):
    """Every (path, key, value) of a parsed JSON document."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield path, key, item
            yield from _walk(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk(item, f"{path}[{index}]")


def screen(document: dict) -> dict:
    """The export's JSON, checked before torch parses any of it; raises ExportRejected.

    Only ATen/prims operators (and ``getitem``) as node targets, identifiers as names, no
    nested graphs (higher-order operators), no symbolic shape (torch would ``sympify`` its
    expression), no custom object, only parameters, buffers, tensor constants and the one
    input as inputs, only the logits as output. Node metadata (stack traces and the like)
    is dropped: nothing of it is needed to run the graph.
    """
    if not isinstance(document, dict) or "graph_module" not in document:
        raise ExportRejected("the export is not a torch.export program")
    if document.get("range_constraints"):
        raise ExportRejected(
            f"the exported graph has symbolic shapes; {FIX} of a fixed shape (no .item(), "
            "no shape that depends on token values)"
        )
    for path, key, value in _walk(document):
        if key in ("expr_str", "as_expr", "as_sym_int", "as_sym_float", "as_sym_bool") and value:
            raise ExportRejected(
                f"the exported graph has a symbolic value at {path}; {FIX} of a fixed shape"
            )
        if key in ("as_graph", "as_custom_obj", "as_operator") and value:
            raise ExportRejected(
                f"the exported graph holds a nested graph, custom object or operator argument "
                f"at {path}; {FIX} built from plain PyTorch operators (no torch.cond, "
                "torch.library ops, Triton kernels or callbacks)"
            )
    graph = document["graph_module"]["graph"]
    if graph.get("custom_obj_values"):
        raise ExportRejected(f"the exported graph holds custom objects; {FIX}")
    for node in graph["nodes"]:
        target = node.get("target")
        if not isinstance(target, str) or not TARGET.fullmatch(target):
            raise ExportRejected(
                f"the exported graph calls {str(target)[:200]!r}, which is not a PyTorch (ATen) "
                f"operator; {FIX} built from plain PyTorch operators: no custom op "
                "(torch.library), Triton kernel, Python callback or higher-order op in forward"
            )
        node["metadata"] = {}
    for path, key, value in _walk(graph):
        if key == "name" and isinstance(value, str) and not NAME.fullmatch(value):
            raise ExportRejected(f"the exported graph has a malformed name at {path}")
    signature = document["graph_module"]["signature"]
    for spec in signature["input_specs"]:
        kind = next(iter(spec))
        if kind not in INPUT_KINDS:
            raise ExportRejected(
                f"the exported graph takes a {kind} input; {FIX} (no effect tokens, no "
                "custom objects)"
            )
    users = [s for s in signature["input_specs"] if "user_input" in s]
    outputs = signature["output_specs"]
    if len(users) != 1:
        raise ExportRejected("the exported graph must take exactly one input, the tokens")
    for spec in outputs:
        kind = next(iter(spec))
        if kind == "buffer_mutation":
            name = spec[kind].get("buffer_name", "?")
            raise ExportRejected(
                f"model.forward mutates buffer {name!r}: {FIX}; move {name!r}'s update out of "
                "forward (or compute it as a local tensor)"
            )
        if kind == "user_input_mutation":
            raise ExportRejected(
                f"model.forward writes into its input tokens: {FIX}; copy them first"
            )
        if kind != "user_output":
            raise ExportRejected(
                f"the exported graph returns a {kind}; {FIX} returning only logits"
            )
    if len(outputs) != 1:
        raise ExportRejected("model(inputs) must return one tensor of logits")
    return document


def check_graph(program: torch.export.ExportedProgram) -> None:
    """Every operator of ``program`` pure ATen/prims, its signature mutation-free; raises ExportRejected."""
    signature = program.graph_signature
    if signature.buffers_to_mutate:
        name = next(iter(signature.buffers_to_mutate.values()))
        raise ExportRejected(
            f"model.forward mutates buffer {name.removeprefix(PREFIX)!r}: {FIX}; move its update "
            "out of forward (or compute it as a local tensor)"
        )
    if signature.user_inputs_to_mutate:
        raise ExportRejected(f"model.forward writes into its input tokens: {FIX}; copy them first")
    for node in program.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op != "call_function":
            raise ExportRejected(f"the exported graph has a {node.op} node {node.name}; {FIX}")
        target = node.target
        if target is operator.getitem:
            continue
        if not isinstance(target, torch._ops.OpOverload) or target.namespace not in NAMESPACES:
            raise ExportRejected(
                f"model.forward calls {target}, which is not a PyTorch (ATen) operator: {FIX} built "
                "from plain PyTorch operators (no custom op via torch.library, Triton kernel, "
                "Python callback or higher-order op in forward)"
            )
        schema = target._schema
        if schema.name.split("::")[-1] in OUTSIDE or any(
            a.name == "filename" for a in schema.arguments
        ):
            raise ExportRejected(
                f"model.forward calls {target}, which reaches outside its tensors: {FIX}"
            )
        value = node.meta.get("val")
        if target in SCALAR_READS or isinstance(
            value, torch.SymInt | torch.SymFloat | torch.SymBool
        ):
            raise ExportRejected(
                f"model.forward reads tensor values into Python ({target}: .item(), .tolist(), "
                f"int(tensor)): {FIX} computed with tensor operators only"
            )
        if schema.is_mutable:
            raise ExportRejected(f"model.forward calls the in-place operator {target}: {FIX}")
        if torch.Tag.nondeterministic_seeded in target.tags and _draws(node):
            raise ExportRejected(
                f"model.forward calls the random operator {target}: {FIX} (a random generator's "
                "state changes from call to call); no dropout or sampling when scored"
            )


def _draws(node: torch.fx.Node) -> bool:
    """Whether a call to an operator that may draw random numbers does: dropout (SDPA's
    ``dropout_p``, dropout's ``p`` with ``train``) at zero or off draws nothing."""
    schema = node.target._schema
    values = {arg.name: arg.default_value for arg in schema.arguments if arg.has_default_value()}
    values.update(zip((arg.name for arg in schema.arguments), node.args, strict=False))
    values.update(node.kwargs)
    if values.get("train") is False:
        return False
    rate = values.get("dropout_p", values.get("p"))
    return not (isinstance(rate, int | float) and rate == 0)


def load_weights(source: Path | bytes, name: str = "") -> dict[str, torch.Tensor]:
    """A checkpoint's tensors, read as plain tensors (no code runs) from its file (mapped) or
    its bytes (``name`` then names it in errors); raises ExportRejected."""
    if isinstance(source, bytes):
        state = torch.load(io.BytesIO(source), map_location="cpu", weights_only=True)
    else:
        state = torch.load(source, map_location="cpu", weights_only=True, mmap=True)
        name = Path(source).name
    if not isinstance(state, Mapping) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise ExportRejected(f"{name} must hold a state dict of named tensors")
    return dict(state)


class Program:
    """An export checked by the harness, runnable with the weights of any checkpoint of its model.

    Args:
        directory: holds ``GRAPH_FILE`` and ``CONSTANTS_FILE`` (written by ``export_model``, in
            a process that ran candidate code: untrusted).
        rows, seq, vocab: the scored batch shape and the logits' width.
        device: where the graph runs.
    """

    def __init__(self, directory: Path, *, rows: int, seq: int, vocab: int, device: str) -> None:
        graph, constants = graph_files(directory)
        self.digests = digests(graph, constants)  # of the bytes it is built from (``built_from``)
        try:
            document = json.loads(graph)
        except ValueError as exc:
            raise ExportRejected(f"{GRAPH_FILE} is not JSON") from exc
        self.document = screen(document)
        self.constants = load_weights(constants, CONSTANTS_FILE)  # on the device once bound
        self.shape, self.vocab, self.device = (rows, seq), vocab, device
        self._bound: torch.nn.Module | None = None
        specs = self.document["graph_module"]["signature"]["input_specs"]
        self.parameters = [s["parameter"]["parameter_name"] for s in specs if "parameter" in s]
        self.buffers = [
            s["buffer"]["buffer_name"]
            for s in specs
            if "buffer" in s and s["buffer"].get("persistent", True)
        ]
        wanted = [
            s["tensor_constant"]["tensor_constant_name"] for s in specs if "tensor_constant" in s
        ]
        wanted += [
            s["buffer"]["buffer_name"]
            for s in specs
            if "buffer" in s and not s["buffer"].get("persistent", True)
        ]
        if sorted(wanted) != sorted(self.constants):
            raise ExportRejected("the export's constants do not match its graph")
        for name in self.parameters + self.buffers:
            if not name.startswith(PREFIX):
                raise ExportRejected(
                    f"the exported graph holds a tensor {name!r} outside the model"
                )

    def built_from(self, directory: Path) -> bool:
        """Whether ``directory``'s graph files hold the bytes this program was built from."""
        try:
            return digests(*graph_files(directory)) == self.digests
        except ExportRejected:
            return False

    def _metas(self) -> dict[str, dict]:
        """The graph's record of every parameter and persistent buffer, by the model's own names."""
        graph = self.document["graph_module"]["graph"]
        specs = self.document["graph_module"]["signature"]["input_specs"]
        args = {
            spec[kind][f"{kind}_name"]: spec[kind]["arg"]["name"]
            for spec in specs
            for kind in ("parameter", "buffer")
            if kind in spec
        }
        return {
            name.removeprefix(PREFIX): graph["tensor_values"][args[name]]
            for name in self.parameters + self.buffers
        }

    def shapes(self) -> dict[str, list[int]]:
        """The graph's shape of every parameter and persistent buffer, by the model's own names."""
        return {
            name: [size["as_int"] for size in meta["sizes"]] for name, meta in self._metas().items()
        }

    def bound_bytes(self) -> int:
        """What the program holds on its device once bound: every parameter and persistent buffer
        in the graph's dtype, and the constants."""
        held = sum(t.numel() * t.element_size() for t in self.constants.values())
        for meta in self._metas().values():
            elements = math.prod(size["as_int"] for size in meta["sizes"])
            held += elements * _SERIALIZE_TO_TORCH_DTYPE[meta["dtype"]].itemsize
        return held

    def blank(self) -> dict[str, torch.Tensor]:
        """Zeros in ``shapes``: bind the program before any checkpoint exists (``bind`` casts them)."""
        return {name: torch.zeros(shape) for name, shape in self.shapes().items()}

    def bind(self, weights: Mapping[str, torch.Tensor]) -> torch.nn.Module:
        """The graph with every parameter and persistent buffer taken from ``weights`` (a
        checkpoint's state dict, by the model's own names), checked; raises ExportRejected.

        The first call rebuilds and checks the graph; a later one puts the new checkpoint's
        tensors into that module in place (the same names and shapes checked, cast as before)
        and returns it: the module of an earlier call then holds the new weights."""
        if self._bound is not None:
            return self._rebind(weights)
        state: dict[str, torch.Tensor] = {}
        for name in self.parameters + self.buffers:
            own = name.removeprefix(PREFIX)
            if own not in weights:
                raise _lacks(own)
            tensor = weights[own]
            state[name] = (
                nn.Parameter(tensor, requires_grad=False) if name in self.parameters else tensor
            )
        artifact = SerializedArtifact(
            json.dumps(self.document).encode(),
            state,
            {name: tensor.to(self.device) for name, tensor in self.constants.items()},
            None,
        )
        try:
            program = deserialize(artifact)
        except Exception as exc:
            raise ExportRejected(
                f"the export cannot be rebuilt with the checkpoint's tensors: {type(exc).__name__}: "
                f"{str(exc)[:500]}"
            ) from exc
        check_graph(program)
        self._fit(program)
        self._bound = program.module()
        return self._bound

    def _rebind(self, weights: Mapping[str, torch.Tensor]) -> torch.nn.Module:
        """``bind`` once the module exists: every tensor checked first, then copied in."""
        held = self._bound.state_dict(keep_vars=True)
        taken = {}
        for name in self.parameters + self.buffers:
            own = name.removeprefix(PREFIX)
            if own not in weights:
                raise _lacks(own)
            if tuple(weights[own].shape) != tuple(held[name].shape):
                raise _misshapen(own, tuple(weights[own].shape), tuple(held[name].shape))
            taken[name] = weights[own]
        with torch.no_grad():
            for name, tensor in taken.items():
                held[name].copy_(tensor)
        return self._bound

    def _fit(self, program: torch.export.ExportedProgram) -> None:
        """Check the placeholders' shapes against the checkpoint's and the input and output against
        the scored shape; cast each tensor to the graph's dtype and move it to the device (as
        ``load_state_dict`` would)."""
        placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
        state = program.state_dict
        for spec in program.graph_signature.input_specs:
            value = placeholders[spec.arg.name].meta.get("val")
            if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT:
                if value is None or tuple(value.shape) != self.shape or value.dtype != torch.int64:
                    raise ExportRejected(
                        f"the exported graph's input is not int64 tokens of shape {self.shape}"
                    )
                continue
            if spec.target not in state:
                continue  # a constant, placed by the export
            tensor = state[spec.target]
            if value is None or tuple(tensor.shape) != tuple(value.shape):
                want = None if value is None else tuple(value.shape)
                raise _misshapen(spec.target.removeprefix(PREFIX), tuple(tensor.shape), want)
            moved = tensor.to(device=self.device, dtype=value.dtype)
            is_param = isinstance(tensor, nn.Parameter)
            state[spec.target] = nn.Parameter(moved, requires_grad=False) if is_param else moved
        output = next(n for n in program.graph.nodes if n.op == "output").args[0][0]
        value = output.meta.get("val")
        want = (*self.shape, self.vocab)
        if value is None or tuple(value.shape) != want or value.dtype != torch.float32:
            raise ExportRejected(
                f"model(inputs) must return logits of shape (batch, seq, >= {self.vocab}); the "
                f"export gives {None if value is None else tuple(value.shape)}"
            )


def graph_files(directory: Path) -> tuple[bytes, bytes]:
    """The bytes of ``directory``'s ``GRAPH_FILE`` and ``CONSTANTS_FILE``; raises ExportRejected."""
    graph = Path(directory) / GRAPH_FILE
    if not graph.is_file() or graph.stat().st_size > MAX_GRAPH_BYTES:
        raise ExportRejected(f"the export wrote no {GRAPH_FILE} (or one over 256 MiB)")
    try:
        return graph.read_bytes(), (Path(directory) / CONSTANTS_FILE).read_bytes()
    except OSError as exc:
        raise ExportRejected(f"the export wrote no {CONSTANTS_FILE}") from exc


def digests(*files: bytes) -> tuple[str, ...]:
    """SHA-256 of each of ``files``' bytes."""
    return tuple(hashlib.sha256(data).hexdigest() for data in files)


def _lacks(name: str) -> ExportRejected:
    return ExportRejected(
        f"the model uses {name!r}, which the checkpoint lacks: the scored weights are "
        "the checkpoint's, so save the model's whole state_dict()"
    )


def _misshapen(name: str, got: tuple, want: tuple | None) -> ExportRejected:
    return ExportRejected(
        f"the checkpoint's {name!r} has shape {got}, the exported model's {want}: "
        "save the weights of the model build_model(config) makes"
    )
