"""Accuracy report: run a model in float32 and converted, on the same input, layer by layer.

:func:`accuracy_report` converts a Gluon HybridBlock with
:func:`mxamp.conversion.convert.convert_hybrid_block`,
runs both graphs on the same batch with every layer's output exposed, and returns an
:class:`AccuracyReport`: the relative L2 error of each layer's output against float32, the dtype
each layer ran in, the count of ops per dtype, the number of casts, and the agreement of the
final outputs (relative error, top-1 agreement for classifiers).

From a shell, on a Gluon model-zoo network (Xavier init, seeded random images)::

    python -m mxamp.compare --model resnet18_v1 --dtype bfloat16 --batch 4
    python -m mxamp.compare --model resnet50_v1 --max-rel-error 0.02   # exit 1 if worse

>>> import mxnet as mx
>>> net = mx.gluon.nn.Dense(4, in_units=8)
>>> net.initialize()
>>> report = accuracy_report(net, mx.nd.ones((2, 8)), 'bfloat16')
>>> from mxamp.backend.cpu import cpu_features       # float32 where the CPU has no bfloat16 kernels
>>> ran = 'float32' if cpu_features().bf16_class == 'none' else 'bfloat16'
>>> report.layers[0].op, report.layers[0].dtype == ran
('FullyConnected', True)
"""
import argparse
import collections
import sys
from dataclasses import dataclass, field

import mxnet as mx
import numpy as np

from mxamp import dtypes
from mxamp.errors import as_input_tuple
from mxamp.conversion.convert import convert_hybrid_block
from mxamp.conversion.graph import trace_graph
from mxamp.backend.mxnet_private import BlockView, NumpySymbol
from mxamp.backend.graphs import CAST_OPS, cast_nodes, graph_nodes, output_dtypes


@dataclass
class LayerError:
    """One layer output: its node name, op, the dtype it ran in, and its error against float32."""

    name: str
    op: str
    dtype: str
    rel_error: float


@dataclass
class AccuracyReport:
    """What :func:`accuracy_report` measured (``str(report)`` prints it as a table).

    >>> AccuracyReport('bfloat16', 0.004, 1.0, 8).top1_agreement
    1.0
    """

    target: str
    output_rel_error: float
    top1_agreement: float  # fraction of samples whose argmax agrees (nan if not a classifier)
    samples: int
    layers: list = field(default_factory=list)
    op_dtypes: dict = field(default_factory=dict)  # op -> {dtype: count}
    casts: int = 0

    def worst(self, count=5):
        """The ``count`` layers with the largest relative error.

        >>> r = AccuracyReport('bfloat16', 0.0, 1.0, 1, [LayerError('a', 'relu', 'bfloat16', .1)])
        >>> [l.name for l in r.worst(1)]
        ['a']
        """
        return sorted(self.layers, key=lambda l: -l.rel_error)[:count]

    def format(self):
        """The report as text: per-layer table, ops per dtype, output agreement.

        >>> 'output' in AccuracyReport('bfloat16', 0.004, 1.0, 8).format()
        True
        """
        lines = ["%-48s %-16s %-9s %s" % ("layer", "op", "dtype", "rel. L2 error")]
        lines += ["%-48s %-16s %-9s %.5f" % (l.name[:48], l.op[:16], l.dtype, l.rel_error)
                  for l in self.layers]
        lines.append("")
        lines.append("ops per dtype (%d casts inserted):" % self.casts)
        for op, counts in sorted(self.op_dtypes.items()):
            lines.append("  %-30s %s" % (op, ", ".join("%s x%d" % kv for kv in sorted(
                counts.items()))))
        lines.append("")
        lines.append("output relative L2 error vs float32: %.5f" % self.output_rel_error)
        if not np.isnan(self.top1_agreement):
            lines.append("top-1 agreement with float32: %d/%d" % (
                round(self.top1_agreement * self.samples), self.samples))
        return "\n".join(lines)

    def __str__(self):
        return self.format()


def _rel_error(low, ref):
    low, ref = low.astype(np.float64), ref.astype(np.float64)
    norm = np.linalg.norm(ref)
    diff = np.linalg.norm(low - ref)
    return float(diff / norm) if norm > 0 else float(diff)


def _run_internals(sym, in_syms, params, inputs, output_names):
    """Forward ``sym`` with the named internal outputs exposed; return name -> float32 numpy."""
    internals = sym.get_internals()
    # Typed input variables spare SymbolBlock a "cannot decide type" warning.
    typed = [mx.sym.var(s.name, dtype=x.dtype) for s, x in zip(in_syms, inputs)]
    typed = [t.as_np_ndarray() if isinstance(s, NumpySymbol) else t
             for t, s in zip(typed, in_syms)]
    exposed = mx.gluon.SymbolBlock([internals[n] for n in output_names], typed, params=params)
    outs = exposed(*inputs)
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    return {n: (_to_fp32(o).asnumpy()) for n, o in zip(output_names, outs)}


def _to_fp32(array):
    legacy = array.as_nd_ndarray() if isinstance(array, mx.np.ndarray) else array
    return mx.nd.amp_cast(legacy, dtype="float32") if dtypes.is_float(legacy.dtype) else legacy


def _layer_outputs(sym):
    """Output names of every op node (variables and AMP casts excluded), with their op."""
    out = []
    internals = sym.get_internals().list_outputs()
    ops = {n["name"]: n["op"] for n in graph_nodes(sym)}
    for name in internals:
        node = name.rsplit("_output", 1)[0]
        op = ops.get(node)
        if op is not None and op != "null" and op not in CAST_OPS:
            out.append((name, op))
    return out


def accuracy_report(block, inputs, target_dtype="bfloat16", **convert_options):
    """Convert ``block`` and compare it with float32 on ``inputs``, layer by layer.

    ``inputs`` is an NDArray (or a list, one per forward argument); ``convert_options`` go to
    :func:`~mxamp.conversion.convert.convert_hybrid_block` (``excluded_sym_names``, ``fp32_ops``, ...).
    Output agreement is measured on the model's first output.
    The block is run on the CPU, so the target must be one the CPU computes (bfloat16).

    >>> net = mx.gluon.nn.Dense(3, in_units=5)
    >>> net.initialize()
    >>> accuracy_report(net, mx.nd.ones((4, 5))).samples
    4
    """
    inputs = as_input_tuple(inputs)
    in_syms, fp32_sym = trace_graph(block, inputs)
    converted = convert_hybrid_block(block, target_dtype, ctx=mx.cpu(), example_inputs=inputs,
                                     **convert_options)
    if converted.cannot_run_on_cpu:   # float16: it builds, but the comparison runs it here
        raise RuntimeError(converted.cannot_run_on_cpu)
    target = dtypes.normalize(target_dtype)
    lp_sym = BlockView(converted).cached_graph[1]
    layers = _layer_outputs(fp32_sym)
    names = [n for n, _ in layers]
    ref = _run_internals(fp32_sym, in_syms, block.collect_params(), inputs, names)
    low = _run_internals(lp_sym, in_syms, converted.collect_params(), inputs, names)
    kinds = output_dtypes(lp_sym, **{s.name: x.dtype for s, x in zip(in_syms, inputs)})
    report = AccuracyReport(target, float("nan"), float("nan"), int(inputs[0].shape[0]),
                            casts=len(cast_nodes(lp_sym)))
    counts = collections.defaultdict(collections.Counter)
    for name, op in layers:
        kind = kinds.get(name, "unknown")
        counts[op][kind] += 1
        report.layers.append(LayerError(name, op, kind, _rel_error(low[name], ref[name])))
    report.op_dtypes = {op: dict(c) for op, c in counts.items()}
    out_name = fp32_sym.list_outputs()[0]
    final_low, final_ref = low[out_name], ref[out_name]
    report.output_rel_error = _rel_error(final_low, final_ref)
    if final_ref.ndim == 2:
        report.top1_agreement = float(np.mean(final_low.argmax(1) == final_ref.argmax(1)))
    return report


def main(argv=None):
    """CLI: ``python -m mxamp.compare --model resnet18_v1 --dtype bfloat16``; returns the exit code.

    >>> # main(['--model', 'resnet18_v1', '--batch', '2']) prints the report and returns 0
    """
    parser = argparse.ArgumentParser(
        prog="python -m mxamp.compare",
        description="Run a Gluon model-zoo network in float32 and converted to low precision "
                    "on the same random batch; print per-layer relative error, the dtype each "
                    "op ran in, and output agreement.")
    parser.add_argument("--model", default="resnet18_v1",
                        help="mx.gluon.model_zoo.vision name (default resnet18_v1)")
    parser.add_argument("--dtype", default="bfloat16", help="target dtype (default bfloat16)")
    parser.add_argument("--batch", type=int, default=4, help="images per batch (default 4)")
    parser.add_argument("--size", type=int, default=224, help="image side (default 224)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--exclude", nargs="*", default=None,
                        help="node names kept in float32 (excluded_sym_names)")
    parser.add_argument("--worst", type=int, default=0,
                        help="print only the N layers with the largest error (default: all)")
    parser.add_argument("--max-rel-error", type=float, default=None,
                        help="exit with status 1 if the output error reaches this, or top-1 "
                             "disagrees on any image")
    args = parser.parse_args(argv)
    mx.random.seed(args.seed)
    np.random.seed(args.seed)
    try:
        net = mx.gluon.model_zoo.vision.get_model(args.model)
    except ValueError as err:
        parser.error(str(err).splitlines()[0])
    net.initialize(mx.init.Xavier())
    net.hybridize()
    images = mx.nd.random.uniform(shape=(args.batch, 3, args.size, args.size))
    try:
        report = accuracy_report(net, images, args.dtype, excluded_sym_names=args.exclude)
    except (ValueError, RuntimeError, TypeError) as err:
        parser.error(str(err))
    if args.worst:
        report.layers = report.worst(args.worst)
    print("%s, %s, batch %dx3x%dx%d, seed %d" % (args.model, report.target, args.batch,
                                                args.size, args.size, args.seed))
    print(report.format())
    failed = args.max_rel_error is not None and (
        report.output_rel_error >= args.max_rel_error or report.top1_agreement < 1.0)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
