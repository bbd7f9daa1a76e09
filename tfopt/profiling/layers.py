"""The model layer by layer: device time grouped by Keras layer and by op type, from a capture.

TensorFlow names every op after the name scopes it was built in, and Keras opens one per layer call:
`StatefulPartitionedCall/gradient_tape/functional_1/conv_heavy_1/convolution/Conv2DBackpropFilter:
Conv2DBackpropFilter` is the backward pass of layer `conv_heavy` in model `functional`. GPU kernels carry
that name (`tf_op`, or `name` for kernels of XLA-compiled programs); on a CPU-only capture the host's op
events are named so themselves. The layer is the scope after the model's; the `_1` TensorFlow appends to a
scope it has seen before in the same graph is dropped where every layer scope carries one (Keras traces
the step twice into one graph, so all do).

With the model at hand, each layer's FLOPs and bytes per step (`layer_cost.py`) place it against the
device's ridge point (peak FLOP/s over memory bandwidth, `peak_flops.py`): below it the layer waits for
memory, above it for arithmetic. What a capture cannot say: on a CPU-only machine the host's ops share
the cores with the input pipeline, so their time includes waiting for cores; kernels overlapping on
several streams are summed, not merged.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfopt.profiling.breakdown import STEP_MARKER
from tfopt.profiling.trace import KERAS_STEP_EVENTS, KERNEL_16BIT, KERNEL_32BIT, load_xspace

if TYPE_CHECKING:
    import keras

    from tfopt.hardware import Hardware

_MATMUL_OP = re.compile(r"MatMul|Conv|Einsum|CudnnRNN|\bdot\b|gemm|convolution|cudnn", re.IGNORECASE)
_UNIQUIFIER = re.compile(r"_\d+$")
OUTSIDE_LAYERS = "(outside layers)"
# XLA kernels that name no layer, or only the model: fusions of ops from several layers.
XLA_ACROSS_LAYERS = "(XLA fusions across layers)"
# A layer adds a finding of its own when its device time takes at least this share of the wall step.
TOP_LAYER_SHARE = 0.2


@dataclasses.dataclass(frozen=True)
class LayerTime:
    """One layer's (or one op scope's) time in a training step.

    Attributes:
        layer: The Keras layer's name, or the scope outside any layer (`adam`, `compile_loss`).
        seconds_per_step: Its device time per step (host op time on a CPU-only capture).
        share_of_device: Its share of all device (or host op) time, 0..1.
        backward_share: The share of its own time in the backward pass.
        op_types: Its heaviest op types with their seconds per step, heaviest first.
        matmul_share: The share of its time in matmuls, convolutions and recurrent kernels.
        sixteen_bit_share: The share of its typed kernel time in 16-bit types; None where no kernel
            names its type (CPU ops, XLA fusions).
        xla_share: The share of its time in kernels of XLA-compiled programs.
        heaviest_sublayer: For a layer that calls layers of its own (a nested model, attention's
            projections), the one holding most of its time, where one holds more than half.
        flops_per_step: Its FLOPs per training step (forward and backward), where the model was at hand.
        bytes_per_step: Its memory traffic per step, likewise.
        bound: "compute" or "memory" against the device's ridge point; None where unknown.
        recipe: The tfopt recipe that fits it; None where none does.
        fix: Why that recipe, or what to do instead.
    """

    layer: str
    seconds_per_step: float
    share_of_device: float
    backward_share: float
    op_types: tuple[tuple[str, float], ...]
    matmul_share: float
    sixteen_bit_share: float | None
    xla_share: float = 0.0
    heaviest_sublayer: str | None = None
    flops_per_step: float | None = None
    bytes_per_step: float | None = None
    bound: str | None = None
    recipe: str | None = None
    fix: str = ""

    @property
    def intensity(self) -> float | None:
        """FLOPs per byte of memory traffic."""
        if self.flops_per_step is None or not self.bytes_per_step:
            return None
        return self.flops_per_step / self.bytes_per_step

    def to_dict(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "op_types": [list(pair) for pair in self.op_types],
            "intensity": self.intensity,
        }


@dataclasses.dataclass(frozen=True)
class LayerTimes:
    """Where a training step's device time went, by layer and by op type.

    Attributes:
        layers: The Keras layers, the heaviest first, then the scopes outside layers (the optimizer's,
            the loss's), the heaviest first.
        op_types: Seconds per step by op type, the heaviest first.
        device: "GPU" (kernel time) or "CPU" (host op time).
        steps: Training steps in the capture the times are averaged over.
        step_seconds: The mean wall step, where known (for shares of the step).
        ridge_point: The device's FLOPs per byte at which compute and memory take equal time; None
            where its peak or bandwidth is not in the table.
        notes: What the capture could not tell.
    """

    layers: tuple[LayerTime, ...]
    op_types: tuple[tuple[str, float], ...]
    device: str
    steps: int
    step_seconds: float | None = None
    ridge_point: float | None = None
    notes: tuple[str, ...] = ()

    @property
    def top(self) -> LayerTime | None:
        """The heaviest Keras layer (scopes outside layers, the optimizer and the loss are not layers)."""
        return self.layers[0] if self.layers and not self.layers[0].layer.startswith("(") else None

    def share_of_step(self, layer: LayerTime) -> float | None:
        """Its device time over the wall step; None on a CPU-only capture, whose ops run on several threads
        at once (their times add up to more than the step)."""
        return layer.seconds_per_step / self.step_seconds if self.step_seconds and self.device != "CPU" else None

    def top_line(self) -> str:
        top = self.top
        if top is None:
            return "No Keras layer's ops were found in the capture."
        step = self.share_of_step(top)
        where = f"{step:.0%} of the step, " if step is not None else ""
        inside = f" (mostly its {top.heaviest_sublayer})" if top.heaviest_sublayer else ""
        return (
            f"heaviest layer: {top.layer}{inside} ({top.seconds_per_step * 1e3:.3g} ms per step, {where}"
            f"{top.share_of_device:.0%} of {self.device} time) -> {top.recipe or 'no recipe'}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "steps": self.steps,
            "step_seconds": self.step_seconds,
            "ridge_point": self.ridge_point,
            "notes": list(self.notes),
            "top": self.top.layer if self.top else None,
            "op_types": [list(pair) for pair in self.op_types],
            "layers": [{**layer.to_dict(), "share_of_step": self.share_of_step(layer)} for layer in self.layers],
        }


def layer_times(
    xplane: str | Path,
    *,
    step_seconds: float | None = None,
    model: keras.Model | None = None,
    batch_size: int | None = None,
    hardware: Hardware | None = None,
) -> LayerTimes:
    """Groups a capture's device time (host op time without a GPU) by Keras layer and op type.

    Args:
        xplane: The capture's `.xplane.pb`.
        step_seconds: The mean wall step, for each layer's share of it.
        model: The Keras model that was captured, where at hand: its layer names resolve scopes exactly,
            and its shapes give each layer's FLOPs and bytes.
        batch_size: Examples per step (for FLOPs and bytes).
        hardware: The machine the capture ran on (for the ridge point and whether 16-bit units exist).

    Returns:
        The table; empty where the capture holds no op of the model.
    """
    ops, device, steps = _read_ops(xplane)
    scopes = _scope_names(ops, model)
    per_layer: dict[str, dict[str, Any]] = defaultdict(
        lambda: {
            "seconds": 0.0,
            "backward": 0.0,
            "types": defaultdict(float),
            "matmul": 0.0,
            "typed": 0.0,
            "sixteen": 0.0,
            "xla": 0.0,
            "sublayers": defaultdict(float),
        }
    )
    by_type: dict[str, float] = defaultdict(float)
    for (path, op_type, sixteen_bit, from_xla), seconds in ops.items():
        layer, backward = _layer_of(path, scopes)
        if layer == OUTSIDE_LAYERS and from_xla:
            layer = XLA_ACROSS_LAYERS
        entry = per_layer[layer]
        entry["seconds"] += seconds
        entry["backward"] += seconds if backward else 0.0
        entry["types"][op_type] += seconds
        entry["matmul"] += seconds if _MATMUL_OP.search(op_type) else 0.0
        entry["xla"] += seconds if from_xla else 0.0
        sublayer = _sublayer_of(path, scopes)
        if sublayer is not None:
            entry["sublayers"][sublayer] += seconds
        if sixteen_bit is not None:
            entry["typed"] += seconds
            entry["sixteen"] += seconds if sixteen_bit else 0.0
        by_type[op_type] += seconds
    total = sum(entry["seconds"] for entry in per_layer.values())
    costs, notes = _costs(model, batch_size)
    ridge = _ridge_point(hardware, model)
    if ridge is None and costs:
        notes.append(
            "No ridge point for this device (its peak FLOP/s or memory bandwidth is not in tfopt's "
            "table, or it is a CPU): layers are not placed as compute- or memory-bound."
        )
    rows = []
    for layer, entry in per_layer.items():
        flops, traffic = costs.get(layer, (None, None))
        row = LayerTime(
            layer=layer,
            seconds_per_step=entry["seconds"] / steps,
            share_of_device=entry["seconds"] / total if total else 0.0,
            backward_share=entry["backward"] / entry["seconds"] if entry["seconds"] else 0.0,
            op_types=tuple(
                sorted(
                    ((name, seconds / steps) for name, seconds in entry["types"].items()), key=lambda pair: -pair[1]
                )[:3]
            ),
            matmul_share=entry["matmul"] / entry["seconds"] if entry["seconds"] else 0.0,
            sixteen_bit_share=entry["sixteen"] / entry["typed"] if entry["typed"] else None,
            xla_share=entry["xla"] / entry["seconds"] if entry["seconds"] else 0.0,
            heaviest_sublayer=next(
                (name for name, seconds in entry["sublayers"].items() if seconds > entry["seconds"] / 2), None
            ),
            flops_per_step=flops,
            bytes_per_step=traffic,
        )
        rows.append(_with_fix(row, ridge, hardware, model))
    rows.sort(key=lambda row: (row.layer.startswith("("), -row.seconds_per_step))  # Keras layers first
    if not rows:
        notes.append("No op in the capture names a Keras layer's scope (XLA-compiled programs on a CPU name none).")
    if device == "CPU":
        notes.append(
            "A CPU-only capture: layer times are host op times, which include waiting for cores the "
            "input pipeline also uses."
        )
    return LayerTimes(
        layers=tuple(rows),
        device=device,
        steps=steps,
        step_seconds=step_seconds,
        op_types=tuple(
            sorted(((name, seconds / steps) for name, seconds in by_type.items()), key=lambda pair: -pair[1])
        ),
        ridge_point=ridge,
        notes=tuple(notes),
    )


def _with_fix(row: LayerTime, ridge: float | None, hardware: Hardware, model: keras.Model) -> LayerTime:
    """Compute- or memory-bound, and the recipe that fits: 32-bit matmuls and convolutions on hardware with
    16-bit units -> mixed precision (faster units where compute-bound, half the traffic where memory-bound);
    layers of small elementwise ops, and memory-bound ones, -> XLA fusion unless XLA compiled them already."""
    bound = None
    if ridge is not None and row.intensity is not None:
        bound = "compute" if row.intensity >= ridge else "memory"
    if row.layer.startswith("("):
        return dataclasses.replace(row, bound=bound)
    where = (
        f" ({bound}-bound: {row.intensity:.1f} FLOPs/byte against a ridge point of {ridge:.0f})"
        if bound is not None
        else ""
    )
    thirty_two_bit = (row.sixteen_bit_share is not None and row.sixteen_bit_share < 0.1) or (
        row.sixteen_bit_share is None
        and model is not None
        and getattr(getattr(model, "dtype_policy", None), "compute_dtype", "float32") == "float32"
    )
    matmuls = row.matmul_share >= 0.5
    if matmuls and thirty_two_bit and hardware is not None and hardware.has_fast_16bit:
        return dataclasses.replace(
            row,
            bound=bound,
            recipe="mixed_precision",
            fix=(
                f"{row.matmul_share:.0%} of its time in 32-bit matmuls or convolutions{where} on hardware with 16-bit "
                "units: mixed precision runs them there, at half the memory traffic."
            ),
        )
    if row.xla_share >= 0.5 and (bound == "memory" or not matmuls):
        return dataclasses.replace(
            row,
            bound=bound,
            fix=(
                f"XLA compiles it already{where}: at the memory roof a larger batch does not help; fewer channels "
                "in and out of it, or a cheaper layer, is what is left."
            ),
        )
    if bound == "memory" or not matmuls:
        reason = where.strip(" ()") or (
            f"{1 - row.matmul_share:.0%} of its time in ops other than matmuls and convolutions"
        )
        return dataclasses.replace(
            row,
            bound=bound,
            recipe="xla",
            fix=(
                f"{reason}: XLA fuses its small ops into few kernels that keep intermediates on chip; a larger batch "
                "does not help a layer at the memory roof, fusion does."
            ),
        )
    return dataclasses.replace(
        row,
        bound=bound,
        fix=(
            f"compute-bound in the precision it already uses{where}: a larger batch or a cheaper layer (fewer "
            "filters, a smaller kernel) is what is left."
        ),
    )


def _ridge_point(hardware: Hardware, model: keras.Model) -> float | None:
    """Peak FLOP/s in the model's precision over memory bandwidth; it matters only where FLOPs are known,
    which needs the model."""
    if hardware is None or model is None:
        return None
    from tfopt.profiling.peak_flops import memory_bandwidth_bytes_per_second, peak_flops_per_second, precision_in_use

    bandwidth = memory_bandwidth_bytes_per_second(hardware)
    peak = peak_flops_per_second(hardware, precision_in_use(model, hardware))
    return peak / bandwidth if peak and bandwidth else None


def _costs(model: keras.Model, batch_size: int | None) -> tuple[dict[str, tuple[float, float]], list[str]]:
    if model is None or not batch_size:
        return {}, [
            (
                "FLOPs and bytes per layer need the model (tfopt's own captures have it; a capture read "
                "from disk does not): intensity is not computed."
            )
        ]
    from tfopt.profiling.layer_cost import layer_costs

    costs, unknown = layer_costs(model, batch_size)
    notes = []
    if unknown:
        notes.append(
            f"FLOPs unknown for {len(unknown)} layer(s) ({', '.join(unknown[:4])}"
            f"{', ...' if len(unknown) > 4 else ''}): their shapes are not known before a call."
        )
    return costs, notes


# (op path without the type, op type, 16-bit or not or None, from an XLA program) -> seconds in the capture
_Ops = dict[tuple[str, str, bool | None, bool], float]


def _read_ops(xplane: str | Path) -> tuple[_Ops, str, int]:
    """Device kernels by op where the capture has a GPU, else the host's TF op events; and the training
    steps the capture holds (tfopt's step markers, else Keras' train-function calls)."""
    space = load_xspace(xplane)
    gpu_planes = [plane for plane in space.planes if plane.name.startswith("/device:GPU")]
    ops: _Ops = defaultdict(float)
    steps = _step_count(space)
    if gpu_planes:
        for plane in gpu_planes:
            stat_names = {key: metadata.name for key, metadata in plane.stat_metadata.items()}
            for line in plane.lines:
                if not line.name.startswith("Stream"):
                    continue
                for event in line.events:
                    kernel = plane.event_metadata[event.metadata_id].name
                    if kernel.startswith(("Memcpy", "Memset")):
                        continue
                    stats = {
                        stat_names.get(stat.metadata_id): stat_names.get(stat.ref_value, stat.str_value)
                        for stat in event.stats
                        if stat.WhichOneof("value") in ("ref_value", "str_value")
                    }
                    path, op_type = _kernel_op(stats)
                    sixteen = True if KERNEL_16BIT.search(kernel) else False if KERNEL_32BIT.search(kernel) else None
                    ops[(path, op_type, sixteen, "hlo_op" in stats)] += event.duration_ps / 1e12
        return ops, "GPU", steps
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        for line in plane.lines:
            if line.name.startswith(("tf_data", "python")):  # the input pipeline's ops are not the model's
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ":" not in name or "/" not in name.split(":", 1)[0] or " " in name:
                    continue
                path, op_type = name.rsplit(":", 1)
                ops[(path, op_type, None, False)] += event.duration_ps / 1e12
    return ops, "CPU", steps


def _step_count(space: Any) -> int:
    markers = keras_calls = 0
    for plane in space.planes:
        if plane.name.startswith("/host:"):
            for line in plane.lines:
                for event in line.events:
                    name = plane.event_metadata[event.metadata_id].name
                    markers += name == STEP_MARKER
                    keras_calls += name in KERAS_STEP_EVENTS
    return max(1, markers or keras_calls)


def _kernel_op(stats: Mapping[str | None, str]) -> tuple[str, str]:
    """(op path, op type) of a GPU kernel: `tf_op` holds `path:Type`; an XLA kernel names its TF op in
    `name` and its HLO instruction in `hlo_op`."""
    hlo = stats.get("hlo_op")
    if hlo:
        return stats.get("name") or "", re.sub(r"[._]\d+$", "", hlo)
    tf_op = stats.get("tf_op") or ""
    if ":" in tf_op:
        path, op_type = tf_op.rsplit(":", 1)
        return path, op_type
    return tf_op, "unknown"


def _parts(path: str) -> tuple[list[str], bool]:
    parts = [part for part in path.split("/") if part and not part.startswith("StatefulPartitionedCall")]
    backward = bool(parts) and parts[0] == "gradient_tape"
    return (parts[1:] if backward else parts), backward


@dataclasses.dataclass(frozen=True)
class _Scopes:
    model: str | None  # the model's scope in the op names
    layers: dict[str, str]  # layer scope -> layer name
    uniquified: bool  # every layer scope carries TensorFlow's `_N` suffix


def _scope_names(ops: _Ops, model: keras.Model) -> _Scopes:
    """Finds the model's scope (the scope the backward pass runs through that holds the most time) and
    maps each layer scope under it to its layer's name."""
    backward_roots: dict[str, float] = defaultdict(float)
    for (path, *_), seconds in ops.items():
        parts, backward = _parts(path)
        if backward and len(parts) >= 2 and parts[0] != "compile_loss":
            backward_roots[parts[0]] += seconds
    if not backward_roots:  # forward only (or no backward scopes): the scope holding the most op time
        for (path, *_), seconds in ops.items():
            parts, _ = _parts(path)
            if len(parts) >= 3:
                backward_roots[parts[0]] += seconds
    model_scope = max(backward_roots, key=backward_roots.get) if backward_roots else None
    layer_scopes = {
        parts[1]
        for (path, *_) in ops
        for parts in [_parts(path)[0]]
        if model_scope and len(parts) >= 3 and parts[0] == model_scope
    }
    names = {layer.name for layer in getattr(model, "layers", [])} if model is not None else set()
    strip = bool(layer_scopes) and all(_UNIQUIFIER.search(scope) for scope in layer_scopes)
    mapping = {}
    for scope in layer_scopes:
        stripped = _UNIQUIFIER.sub("", scope) if strip else scope
        mapping[scope] = stripped if not names or stripped in names else scope
    return _Scopes(model_scope, mapping, strip)


def _sublayer_of(path: str, scopes: _Scopes) -> str | None:
    """The layer scope inside a layer's scope (`model/backbone/deep_big/MatMul`), told from an op scope
    (`conv/convolution/Conv2DBackpropFilter`) by the `_N` suffix every layer scope carries."""
    parts, _ = _parts(path)
    if scopes.uniquified and len(parts) >= 4 and parts[0] == scopes.model and _UNIQUIFIER.search(parts[2]):
        return _UNIQUIFIER.sub("", parts[2])
    return None


def _layer_of(path: str, scopes: _Scopes) -> tuple[str, bool]:
    parts, backward = _parts(path)
    # `model/layer/op`, or `model/layer` itself (XLA names a kernel after the scope it fused)
    if (
        scopes.model is not None
        and len(parts) >= 2
        and parts[0] == scopes.model
        and (len(parts) >= 3 or parts[1] in scopes.layers)
    ):
        return scopes.layers.get(parts[1], parts[1]), backward
    if len(parts) >= 2 and parts[0] != scopes.model:
        return f"({_UNIQUIFIER.sub('', parts[0])})", backward
    return OUTSIDE_LAYERS, backward
