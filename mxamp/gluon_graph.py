"""Gluon plumbing for graph conversion: tracing a HybridBlock, and a SymbolBlock that exports casts.

>>> import mxnet as mx
>>> net = mx.gluon.nn.Dense(2, in_units=3, prefix='fc_')
>>> net.initialize()
>>> inputs, sym = trace_graph(net, mx.nd.ones((1, 3)))
>>> [i.name for i in inputs], sym.list_outputs()
(['data'], ['fc_fwd_output'])
"""
import logging

import mxnet as mx
from mxnet.gluon import HybridBlock, SymbolBlock

from .errors import AmpArgumentError
from .mxnet_private import BLOCK_CALL_METHOD, BlockView, ParamView
from .state import STATE

_LOG = logging.getLogger(__name__)


class ConvertedBlock(SymbolBlock):
    """The SymbolBlock ``convert_hybrid_block`` returns; ``export`` keeps the AMP casts.

    ``SymbolBlock.imports`` of the exported files gives back the same mixed-precision model.

    >>> issubclass(ConvertedBlock, SymbolBlock)
    True
    """

    def export(self, path, epoch=0, remove_amp_cast=False):
        """Save ``path-symbol.json`` (casts kept unless asked) and ``path-%04d.params``.

        Works before the block has run (MXNet's own export needs one forward pass first).

        >>> import os, tempfile
        >>> from mxamp.convert import convert_hybrid_block
        >>> net = mx.gluon.nn.Dense(2, in_units=3)
        >>> net.initialize()
        >>> folder = tempfile.mkdtemp()
        >>> convert_hybrid_block(net, example_inputs=mx.nd.ones((1, 3))).export(folder + '/m')
        >>> sorted(os.listdir(folder))
        ['m-0000.params', 'm-symbol.json']
        """
        sym = BlockView(self).cached_graph[1]
        sym.save("%s-symbol.json" % path, remove_amp_cast=remove_amp_cast)
        arg_names = set(sym.list_arguments())
        saved = {("arg:" if name in arg_names else "aux:") + name: ParamView(param).reduce()
                 for name, param in self.collect_params().items()}
        save = mx.npx.save if mx.util.is_np_array() else mx.nd.save
        save("%s-%04d.params" % (path, epoch), saved)


def trace_graph(block, example_inputs=None):
    """(input symbols, output symbol) of a HybridBlock, running it once on example input if needed.

    A block that is not hybridized is traced symbolically and left as it was.

    >>> net = mx.gluon.nn.Dense(2, in_units=3, prefix='fc_')
    >>> net.initialize()
    >>> trace_graph(net, mx.nd.ones((1, 3)))[1].list_outputs()
    ['fc_fwd_output']
    """
    view = BlockView(block)
    if example_inputs is not None:
        if not isinstance(example_inputs, (list, tuple)):
            example_inputs = (example_inputs,)
        if not all(isinstance(x, mx.nd.NDArray) for x in example_inputs):
            raise AmpArgumentError("example_inputs must be an NDArray or a list/tuple of "
                                   "NDArrays")
        with mx.autograd.pause():
            block(*example_inputs)  # completes deferred initialisation; caches the graph
        if not view.cached_graph:  # not hybridized: trace symbolically, leave no trace
            graph = view.trace(*example_inputs)
            view.cached_graph = ()
            return graph
    if not view.cached_graph:
        raise RuntimeError(
            "%s has no graph yet (a block's graph is recorded at its first forward pass after "
            "hybridize()): pass example_inputs=<a batch of input>, or call block.hybridize() "
            "and block(x) once first" % type(block).__name__)
    if block.__dict__.get(_GENERATION_ATTR, STATE.generation) != STATE.generation:
        return _retraced(view)
    return view.cached_graph


def _retraced(view):
    """The graph of a block whose cached one was built under another AMP generation (an
    ``amp.init`` since reset, ``amp.tune``'s candidates): that graph holds the generation's
    casts, and converting it casts twice (ResNet-50: 279 casts instead of 89, 1.7x slower).
    Traced again from ``hybrid_forward`` on the same inputs; the block keeps its own graph
    (mxamp's block hook rebuilds it at its next call)."""
    stale = view.cached_graph
    view.cached_graph = ()
    try:
        return view.trace(*stale[0])
    except Exception as err:  # noqa: BLE001 - nested inputs the flat symbols cannot regroup
        _LOG.warning("mxamp: could not trace %s again (%s); converting the graph it built "
                     "under an earlier amp.init, casts included. Pass example_inputs=<a batch> "
                     "to convert a fresh one.", type(view.obj).__name__, err)
        return stale
    finally:
        view.cached_graph = stale


def block_context(block):
    """The context of a block's first parameter (CPU when it has none).

    >>> block_context(mx.gluon.nn.Dense(2))
    cpu(0)
    """
    for param in block.collect_params().values():
        try:
            return param.list_ctx()[0]
        except RuntimeError:  # not initialized yet
            continue
    return mx.cpu()


def symbol_data_shape(sym, known=None):
    """The output shape of ``sym`` as far as MXNet can infer it, or None.

    Shapes come from the parameters' declared shapes and from the inputs of the hybridized
    block whose graph is being built (``STATE`` records them for that call).

    >>> import mxnet as mx
    >>> symbol_data_shape(mx.sym.var('x', shape=(2, 3)) * 2)
    (2, 3)
    """
    if known is None:
        known = getattr(STATE.thread_local(), "graph_input_shapes", None) or {}
    try:
        if known:
            names = set(sym.list_arguments())
            known = {k: v for k, v in known.items() if k in names}
        _, out, _ = sym.infer_shape_partial(**known)
    except Exception:  # noqa: BLE001 - an uninferable graph only means "shape unknown"
        return None
    if not out or not out[0] or not all(out[0]):
        return None
    return tuple(out[0])


_GENERATION_ATTR = "_mxamp_generation"
_INPUT_SHAPES_ATTR = "_mxamp_input_shapes"


def recorded_input_shapes(block):
    """The input shapes a hybridized block last built its graph with while mxamp's block hook
    was installed (:func:`hook_block_graphs`), else {}.

    >>> recorded_input_shapes(mx.gluon.nn.Dense(2))
    {}
    """
    return dict(block.__dict__.get(_INPUT_SHAPES_ATTR) or {})


def hook_block_graphs():
    """Make a hybridized block rebuild a graph built under another AMP generation.

    Installed at the first ``init`` (or ``cast_model``) and kept for the life of the process
    (``reset`` changes the generation too, so graphs built with casts are rebuilt without them).
    The check is one attribute comparison per call of a hybridized block. While a graph is
    built, the block's input shapes are known to :func:`symbol_data_shape`.

    >>> hook_block_graphs()
    """
    original = getattr(HybridBlock, BLOCK_CALL_METHOD)
    if getattr(original, "__mxamp_original__", None) is not None:
        return

    def call_cached_op(block, *args):
        generation = STATE.generation
        view = None
        if block.__dict__.get(_GENERATION_ATTR) != generation:
            view = BlockView(block)
            if view.cached_op is not None:
                view.clear_cached_op()
            block.__dict__[_GENERATION_ATTR] = generation
        if (view or BlockView(block)).cached_op is None:
            # the graph is built in this call: conditions on shapes (mxamp.lists.conditions)
            # infer them from the block's real inputs, named as Gluon names its input vars
            local = STATE.thread_local()
            outer = getattr(local, "graph_input_shapes", None)
            local.graph_input_shapes = graph_input_shapes(args)
            # kept for convert_hybrid_block: the AMX guard needs shapes (unknown holds)
            block.__dict__[_INPUT_SHAPES_ATTR] = local.graph_input_shapes
            try:
                return original(block, *args)
            finally:
                local.graph_input_shapes = outer
        return original(block, *args)

    call_cached_op.__mxamp_original__ = original
    call_cached_op.__name__ = original.__name__
    call_cached_op.__doc__ = original.__doc__
    setattr(HybridBlock, BLOCK_CALL_METHOD, call_cached_op)


def graph_input_shapes(args):
    """{'data': shape} or {'data0': ..., 'data1': ...}: Gluon's names for a block's array inputs.

    >>> graph_input_shapes((mx.nd.ones((2, 3)),))
    {'data': (2, 3)}
    """
    flat = []

    def walk(value):
        if isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif value is not None:
            flat.append(value)
    walk(args)
    shapes = [getattr(a, "shape", None) for a in flat]
    if len(shapes) == 1:
        return {"data": shapes[0]} if shapes[0] else {}
    return {"data%d" % i: s for i, s in enumerate(shapes) if s}
