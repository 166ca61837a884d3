"""OnnxRunner: loads an ONNX model once (checks, constants, op lookup) and runs it on fusegrad Tensors per call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

import onnx
from fusegrad import Tensor
from fusegrad.dtype import DType, to_numpy_dtype
from fusegrad.onnx import ops  # noqa: F401  (fills the op table)
from fusegrad.onnx.loader import attr_value, onnx_dtype, opset_versions, parse_model, to_numpy, topo_order
from fusegrad.onnx.replay import Replays
from fusegrad.onnx.registry import CHECKS, FOLD, FOLD_LIMIT, HOST, OPS, Node, T, dtype_of, np_to_tensor


RANDOM_OPS = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial"}
# nodes that must run on every call: random draws and control flow (their bodies may read graph inputs)
NOT_FOLDED = RANDOM_OPS | {
    "Dropout",
    "If",
    "Loop",
    "Scan",
    "SequenceMap",
}


@dataclass
class Step:
    node: Node
    fn: Any
    fold: Any
    inputs: list[str]
    outputs: list[str]
    store: bool = False  # outputs stored when computed (`_stored_when_shared`)


@dataclass
class Graph:
    """A graph ready to run: nodes in dependency order with their attributes converted, subgraphs prepared too."""

    steps: list[Step]
    inputs: list[str]
    outputs: list[str]
    constants: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class InputSpec:
    name: str
    dtype: DType
    dims: list[int | str | None] | None  # None: rank unknown; a str is a symbolic dim, None an unnamed one
    sequence: bool = False  # a sequence of tensors of this dtype, given as a list


def _value_spec(v: onnx.ValueInfoProto, where: str) -> InputSpec:
    kind = v.type.WhichOneof("value")
    if kind == "sequence_type" and v.type.sequence_type.elem_type.WhichOneof("value") == "tensor_type":
        elem = v.type.sequence_type.elem_type.tensor_type.elem_type
        return InputSpec(v.name, onnx_dtype(elem, f"{where} {v.name!r}") if elem else None, None, sequence=True)
    if kind != "tensor_type":
        raise NotImplementedError(f"{where} {v.name!r} is a {kind or 'untyped value'}; fusegrad runs tensors only")
    tt = v.type.tensor_type
    dt = onnx_dtype(tt.elem_type, f"{where} {v.name!r}")
    if not tt.HasField("shape"):
        return InputSpec(v.name, dt, None)
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
    return InputSpec(v.name, dt, dims)


# ops whose output is a view of their input (or a constant): stored, they would only add a copy
VIEW_OPS = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Expand", "Slice", "Split"}
VIEW_OPS |= {"Shape", "Size", "Constant", "ConstantOfShape"}
# a shared computed output this small stays lazy: its recomputation costs less than a kernel launch
SHARED_STORE_MIN_SIZE = 2**12


def _stored_when_shared(n: onnx.NodeProto, readers: dict[str, int]) -> bool:
    """A computed output read by more than one node is stored once. Left lazy, each reader computes it again, and a
    chain of them compounds: DenseNet's concat of the last concat and the new features (24 deep: a BN + ReLU of a
    992-channel concat, 196k elements, 11.5 ms), ShuffleNet's residual ReLU(Sum) read by the next unit's conv and its
    Sum (the 9th unit's Sum recomputed all 8 before it: 20 -> 360 us)."""
    return n.op_type not in VIEW_OPS and any(readers.get(o, 0) > 1 for o in n.output)


def draws_random(g: onnx.GraphProto) -> bool:
    """Whether a node of the graph or of its subgraphs may draw random numbers (a Dropout with a training input)."""
    for n in g.node:
        if n.op_type in RANDOM_OPS or (n.op_type == "Dropout" and len(n.input) > 2 and n.input[2]):
            return True
        if any(draws_random(sub) for a in n.attribute for sub in ([a.g] if a.HasField("g") else a.graphs)):
            return True
    return False


def _out(v: Any) -> Any:
    return [T(x) for x in v] if isinstance(v, list) else T(v)


class OnnxRunner:
    """Runs an ONNX model (a path, bytes or an onnx.ModelProto) on fusegrad: `runner({"x": array})` → {name: Tensor}."""

    def __init__(self, model: Any):
        self.model, self.base = parse_model(model)
        self.opsets = opset_versions(self.model)
        g = self.model.graph
        self.initializers = {t.name: to_numpy(t, self.base) for t in g.initializer}
        self.input_specs = {v.name: _value_spec(v, "input") for v in g.input}
        self.required = [n for n in self.input_specs if n not in self.initializers]
        self.output_names = [o.name for o in g.output]
        self.graph = self._prepare(g, set(), "graph")
        self._fold_constants()
        self._replays = Replays(self._run_plain, self.output_names, replayable=not draws_random(g))

    def _fold_constants(self) -> None:
        """Runs once, at load, every top-level node whose inputs are all constants (weights built by
        ConstantOfShape, transposed or dequantized initializers, ...), keeping the realized results as constants."""
        self._unfolded = (self.graph.steps, dict(self.initializers))
        const: dict[str, Any] = dict(self.initializers)
        kept, made = [], []
        for st in self.graph.steps:
            ins_known = all(not x or x in const for x in st.inputs)
            if not ins_known or st.node.op_type in NOT_FOLDED or st.node.proto.domain not in ("", "ai.onnx"):
                kept.append(st)
                continue
            env = {x: const[x] for x in st.inputs if x}
            self.run_graph(Graph([st], [], [], {}), env)
            for o in st.outputs:
                if o:
                    const[o] = env[o]
                    made.append(env[o])
        tensors = [v for v in made if isinstance(v, Tensor)]
        if tensors:
            Tensor.realize(*tensors)
        self.graph.steps = kept
        self.initializers = const

    def _prepare(self, g: onnx.GraphProto, outer: set[str], where: str) -> Graph:
        consts = {t.name: to_numpy(t, self.base) for t in g.initializer} if where != "graph" else {}
        known = outer | {v.name for v in g.input} | {t.name for t in g.initializer}
        steps = []
        readers: dict[str, int] = {}
        for n in g.node:
            for x in set(n.input):
                readers[x] = readers.get(x, 0) + 1
        for n in topo_order(g, known, where):
            label = f"node {n.name or n.op_type!r} ({n.domain + '::' if n.domain else ''}{n.op_type})"
            domain = "" if n.domain == "ai.onnx" else n.domain
            fn = OPS.get((domain, n.op_type))
            if fn is None:
                dom = n.domain or "ai.onnx"
                raise NotImplementedError(
                    f"{where}: ONNX op {n.op_type!r} (domain {dom!r}) of {label} is not supported by fusegrad.onnx"
                )
            attrs = {}
            for a in n.attribute:
                try:
                    v = attr_value(a, self.base)
                    if a.name in ("to", "dtype", "output_dtype") and isinstance(v, int) and v:
                        onnx_dtype(v, f"attribute {a.name!r}")
                except (NotImplementedError, ValueError) as e:
                    raise type(e)(f"{where}: {label}: {e}") from None
                if isinstance(v, onnx.GraphProto):
                    inner = known | {o for m in g.node for o in m.output}
                    v = self._prepare(v, inner, f"{where} → {label} attribute {a.name!r}")
                attrs[a.name] = v
            opset = self.opsets.get(domain, 1)
            node = Node(n, attrs, opset, self)
            if (domain, n.op_type) in CHECKS:
                try:
                    CHECKS[(domain, n.op_type)](node)
                except (NotImplementedError, ValueError) as e:
                    raise type(e)(f"{where}: {e}") from None
            store = _stored_when_shared(n, readers)
            steps.append(Step(node, fn, FOLD.get((domain, n.op_type)), list(n.input), list(n.output), store))
            known |= set(n.output)
        return Graph(steps, [v.name for v in g.input], [o.name for o in g.output], consts)

    def _bind(self, feeds: dict[str, Any]) -> dict[str, Any]:
        unknown = [k for k in feeds if k not in self.input_specs]
        if unknown:
            raise ValueError(f"unknown input(s) {unknown}; the model takes {self.required}")
        missing = [k for k in self.required if k not in feeds]
        if missing:
            raise ValueError(f"missing input(s) {missing}; the model takes {self.required}")
        # an initializer that is also a graph input may be overridden: then run the graph as loaded, unfolded
        overrides = any(k in self._unfolded[1] for k in feeds)
        env: dict[str, Any] = dict(self._unfolded[1] if overrides else self.initializers)
        bound: dict[str, int] = {}
        for name, v in feeds.items():
            spec = self.input_specs[name]
            if spec.sequence:
                if not isinstance(v, (list, tuple)):
                    raise ValueError(f"input {name!r} is a sequence: give a list of arrays, not {type(v).__name__}")
                env[name] = [x if isinstance(x, Tensor) else np_to_tensor(np.asarray(x)) for x in v]
                continue
            if not isinstance(v, (Tensor, np.ndarray)):
                v = np.asarray(v, dtype=to_numpy_dtype(spec.dtype))
            if dtype_of(v) != spec.dtype:
                raise ValueError(f"input {name!r} has dtype {dtype_of(v)}, the model expects {spec.dtype}")
            shape = tuple(v.shape)
            if spec.dims is not None:
                want = tuple(d if isinstance(d, int) and d > 0 else (d or "?") for d in spec.dims)
                if len(shape) != len(spec.dims):
                    raise ValueError(f"input {name!r} has shape {shape}, the model expects rank {len(want)}: {want}")
                for i, (s, d) in enumerate(zip(shape, spec.dims)):
                    if isinstance(d, int) and d > 0 and s != d:
                        raise ValueError(f"input {name!r} has shape {shape}, the model expects {want} (dim {i})")
                    if isinstance(d, str):
                        if bound.setdefault(d, s) != s:
                            raise ValueError(
                                f"input {name!r} has shape {shape}: dim {d!r} is {s} here but "
                                f"{bound[d]} in another input"
                            )
            if isinstance(v, np.ndarray):
                t = np_to_tensor(v)
                HOST[id(t)] = (t, v)
                v = t
            env[name] = v
        return env

    def __call__(self, inputs: dict[str, Any] | None = None, **kw: Any) -> dict[str, Tensor]:
        feeds = {**(inputs or {}), **kw}
        env = self._bind(feeds)
        try:
            overrides = any(k in self._unfolded[1] for k in feeds)
            if not overrides and (replayed := self._replays.call({k: env[k] for k in feeds})) is not None:
                return replayed
            steps = self._unfolded[0] if overrides else self.graph.steps
            return self._outputs(Graph(steps, self.graph.inputs, self.graph.outputs), env)
        finally:
            HOST.clear()

    def _run_plain(self, feeds: dict[str, Tensor]) -> dict[str, Tensor]:
        """One call without a replay: what a replay's TinyJit runs and records."""
        return self._outputs(self.graph, self._bind(feeds))

    def _outputs(self, graph: Graph, env: dict[str, Any]) -> dict[str, Any]:
        self.run_graph(graph, env)
        return {name: _out(env[name]) for name in self.output_names}

    def all_steps(self) -> list[Step]:
        """Every step of the model as loaded, before constant folding (Gradient's subgraph may start at a folded
        initializer that a feed overrides)."""
        return self._unfolded[0]

    def run_steps(self, steps: list[Step], outputs: list[str], env: dict[str, Any]) -> list[Any]:
        """run_graph over some steps of a graph (a path through it), giving `outputs`."""
        return self.run_graph(Graph(steps, [], outputs), env)

    def run_graph(self, graph: Graph, env: dict[str, Any]) -> list[Any]:
        """Runs the steps of `graph` in `env` (which holds its inputs and any outer-scope names); returns outputs."""
        env.update(graph.constants)
        for st in graph.steps:
            ins = [env[x] if x else None for x in st.inputs]
            st.node.env = env  # If/Loop/Scan bodies read outer-scope names from it
            try:
                small = all(v is None or (isinstance(v, np.ndarray) and v.size <= FOLD_LIMIT) for v in ins)
                out = st.fold(st.node, *ins) if st.fold is not None and small else st.fn(st.node, *ins)
            except Exception as e:
                e.add_note(f"while running ONNX {st.node}")
                raise
            finally:
                # dropped after the call: a kept env holds every intermediate tensor alive, and TinyJit's capture
                # realizes each live lazy tensor, a second, unfused pass over the whole model (VGG-19: 132 kernels)
                st.node.env = {}
            out = out if isinstance(out, tuple) else (out,)  # a tuple is several outputs; a list is a sequence
            for name, v in zip(st.outputs, out):
                if name:
                    stored = st.store and isinstance(v, Tensor) and v.numel() >= SHARED_STORE_MIN_SIZE
                    env[name] = v.contiguous() if stored else v
        return [env[o] for o in graph.outputs]
