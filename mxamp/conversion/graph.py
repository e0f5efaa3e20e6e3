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
from mxnet.gluon import SymbolBlock

from mxamp.errors import as_input_tuple
from mxamp.backend.mxnet_private import BlockView, ParamView
from mxamp.runtime.casting import cast
from mxamp.runtime.hooks import dropped_graph_inputs, graph_holds_amp_casts
from mxamp.runtime.patches import operators_unpatched
from mxamp.backend.graphs import param_dtypes
from mxamp.backend.heap import release_before_first_call

_LOG = logging.getLogger(__name__)


class ConvertedBlock(SymbolBlock):
    """The SymbolBlock ``convert_hybrid_block`` returns; ``export`` keeps the AMP casts.

    ``SymbolBlock.imports`` of the exported files gives back the same mixed-precision model.

    >>> issubclass(ConvertedBlock, SymbolBlock)
    True
    """

    #: Why this block cannot compute on a CPU ('' where it can): a float16 conversion made for
    #: a CPU context exports for a GPU server, and refuses to run here.
    cannot_run_on_cpu = ""
    #: Whether the block has been called: the first call gives the C heap's free pages back
    #: first (``heap.release_before_first_call``: what the model it replaced left there).
    called = False

    def forward(self, x, *args):
        """SymbolBlock's forward, after the check of :attr:`cannot_run_on_cpu`."""
        if self.cannot_run_on_cpu and getattr(getattr(x, "context", None), "device_type",
                                               "") == "cpu":
            raise RuntimeError(self.cannot_run_on_cpu)
        if not self.called:
            self.called = True
            release_before_first_call()
        return super().forward(x, *args)

    def export(self, path, epoch=0, remove_amp_cast=False):
        """Save ``path-symbol.json`` (casts kept unless asked) and ``path-%04d.params``.

        Works before the block has run (MXNet's own export needs one forward pass first).

        >>> import os, tempfile
        >>> from mxamp.conversion.convert import convert_hybrid_block
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

    A block that is not hybridized is traced symbolically and left as it was. The graph is
    float32's, without AMP's casts, even where ``amp.init`` is in force.

    >>> net = mx.gluon.nn.Dense(2, in_units=3, prefix='fc_')
    >>> net.initialize()
    >>> trace_graph(net, mx.nd.ones((1, 3)))[1].list_outputs()
    ['fc_fwd_output']
    """
    view = BlockView(block)
    if example_inputs is not None:
        example_inputs = as_input_tuple(
            example_inputs, "example_inputs must be an NDArray or a list/tuple of NDArrays")
        with mx.autograd.pause():
            block(*example_inputs)  # completes deferred initialisation; caches the graph
        if not view.cached_graph:  # not hybridized: trace symbolically, leave no trace
            return _traced(view, example_inputs)
    dropped = dropped_graph_inputs(block)
    if not view.cached_graph and dropped is not None:
        # amp.reset() dropped the graph this block built under AMP: trace it again, float32
        return _traced(view, dropped)
    if not view.cached_graph:
        raise RuntimeError(
            "%s has no graph yet (a block's graph is recorded at its first forward pass after "
            "hybridize()): pass example_inputs=<a batch of input>, or call block.hybridize() "
            "and block(x) once first" % type(block).__name__)
    if graph_holds_amp_casts(block):
        return _retraced(view)
    return view.cached_graph


def _traced(view, inputs):
    """The block's graph traced from ``hybrid_forward`` on ``inputs`` with MXNet's own
    operators (AMP's wrappers out meanwhile); the block keeps the graph it had."""
    kept = view.cached_graph
    view.cached_graph = ()
    try:
        with operators_unpatched():
            return view.trace(*inputs)
    finally:
        view.cached_graph = kept


def _retraced(view):
    """The graph of a block whose cached one was built under AMP (``amp.init``, in force or
    not, ``amp.tune``'s candidates): that graph holds AMP's casts, and converting it casts
    twice (ResNet-50: 279 casts instead of 89, 1.7x slower). Traced again from
    ``hybrid_forward`` on the same inputs."""
    try:
        return _traced(view, view.cached_graph[0])
    except Exception as err:  # noqa: BLE001 - nested inputs the flat symbols cannot regroup
        _LOG.warning("mxamp: could not trace %s again (%s); converting the graph it built "
                     "under amp.init, casts included. Pass example_inputs=<a batch> to "
                     "convert a fresh one.", type(view.obj).__name__, err)
        return view.cached_graph


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


def inference_block(converted, typed_inputs, block, ctx, cannot_run_on_cpu):
    """The :class:`ConvertedBlock` of the graph ``converted``, holding ``block``'s parameter
    values on ``ctx`` in the dtypes the graph wants: an inference model, without gradient
    buffers, its buffers planned once (``static_alloc``)."""
    ret = ConvertedBlock(converted, typed_inputs)
    # float16 for a CPU context builds and exports (for a GPU server); running it here refuses
    ret.cannot_run_on_cpu = cannot_run_on_cpu
    _load_params(ret, block, param_dtypes(converted), ctx)
    # buffers planned once and reused: repeated calls stop growing the process's memory
    # (measured on ResNet-50, batch 8: peak 707-752 MB without, 607-614 MB with; float32 681-705)
    ret.hybridize(static_alloc=True)
    return ret


def _load_params(converted_block, block, wanted, ctx):
    """Give ``converted_block`` the values of ``block``'s parameters, in the dtypes the
    converted graph wants (``wanted``; float32 for the others), on ``ctx``."""
    source = {p.name: p for p in block.collect_params().values()}
    for name, param in converted_block.collect_params().items():
        # reduce() copies into MXNet's default layout: after an inference pass oneDNN may hold
        # a weight in its own blocked layout, which amp_cast cannot always turn into bfloat16
        # (depthwise convolutions: "could not create a primitive descriptor for a reorder")
        value = cast(ParamView(source[name]).reduce(), wanted.get(name, "float32"))
        param.cast(value.dtype)
        # an inference model: no gradient buffers (p.grad_req = 'write' brings them back)
        param.grad_req = "null"
        ParamView(param).load(value, [ctx])
