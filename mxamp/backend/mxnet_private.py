"""The one module that touches MXNet's private API.

mxamp hooks into parts of MXNet 1.9.1 that have no public interface: the AMP protocol of
``gluon.Trainer`` (``_amp_loss_scaler``, ``_amp_original_scale``, ``_scale``), its kvstore
plumbing, the cached graph of a ``HybridBlock``, a ``Parameter``'s arrays, the C functions that
list operators and run the precision pass, and a few classes. Every other module reaches them
through this one: views whose properties each name one private attribute
(:class:`TrainerView`, :class:`BlockView`, :class:`ParamView`, :class:`BucketingView`), and
functions. :data:`PRIVATE_NAMES` lists every private name used;
``tests/test_structure.py`` checks each against the installed MXNet and names any that
is missing, and checks that no other module of mxamp touches one.

Why over 400 lines: it is the one home of every private name mxamp uses, so it grows with
what mxamp hooks; split, the check above would have two homes to keep.

>>> import mxnet as mx
>>> p = mx.gluon.Parameter('w', shape=(2,)); p.initialize()
>>> t = mx.gluon.Trainer([p], 'sgd', kvstore=None)
>>> TrainerView(t).scale
1.0
"""
import ctypes
import functools

import mxnet as mx
from mxnet import base as _base

#: (owner, private name) for every private name this module uses.
PRIVATE_NAMES = []


def _uses(owner, *names):
    PRIVATE_NAMES.extend((owner, name) for name in names)


# ------------------------------------------------------------------------------ C library
_uses("mxnet.base", "_LIB")
LIB = _base._LIB                                   # the loaded libmxnet
check_call, c_str, mx_uint, py_str = _base.check_call, _base.c_str, _base.mx_uint, _base.py_str
c_array_buf, c_str_array, SymbolHandle = _base.c_array_buf, _base.c_str_array, _base.SymbolHandle
MXNetError = _base.MXNetError


def to_default_layout(array):
    """``array``, its storage put back into MXNet's default layout in place (nothing changes
    where it already is).

    After a float32 inference pass, MXNet leaves some weights in oneDNN's blocked layout
    (grouped convolutions store 5-D blocks), and ``amp_cast`` of such a weight to bfloat16
    fails with "could not create a primitive descriptor for a reorder primitive".
    ``MXNDArrayGetData`` reorders a oneDNN array to the default layout before it hands out the
    pointer, which is all this uses it for.

    It waits for the array first. An inference pass does not reorder a weight itself: it
    queues the reorder on MXNet's engine, to run after the operator that read the weight. The
    pass's outputs can be ready before that reorder has run; ``MXNDArrayGetData`` asks whether
    the array is in oneDNN's layout without waiting, so it would find the old layout and skip,
    and the queued reorder would then leave the weight blocked for the cast that follows.

    >>> import mxnet as mx
    >>> to_default_layout(mx.nd.ones((2, 2))).shape
    (2, 2)
    """
    array.wait_to_read()   # the engine's queued writes to it (a layout change among them)
    pointer = ctypes.c_void_p()
    check_call(LIB.MXNDArrayGetData(array.handle, ctypes.byref(pointer)))
    return array


def list_op_names():
    """Every operator name registered in libmxnet, aliases included.

    >>> 'FullyConnected' in list_op_names()
    True
    """
    size = mx_uint()
    plist = ctypes.POINTER(ctypes.c_char_p)()
    check_call(LIB.MXListAllOpNames(ctypes.byref(size), ctypes.byref(plist)))
    return [py_str(plist[i]) for i in range(size.value)]


def op_handle(name):
    """The handle (an int) of the operator registered as ``name``.

    >>> op_handle('flatten') == op_handle('Flatten')
    True
    """
    handle = ctypes.c_void_p()
    check_call(LIB.NNGetOpHandle(c_str(name), ctypes.byref(handle)))
    return handle.value


def op_name(handle):
    """The real (canonical) name of the operator with ``handle``; cheap, no docs are built.

    >>> op_name(op_handle('flatten'))
    'Flatten'
    """
    name = ctypes.c_char_p()
    check_call(LIB.MXSymbolGetAtomicSymbolName(ctypes.c_void_p(handle), ctypes.byref(name)))
    return py_str(name.value)


def op_arguments(handle):
    """``(canonical name, ((argument, type description), ...), key_var_num_args)`` of an op.

    >>> op_arguments(op_handle('Concat'))[2]
    'num_args'
    """
    real_name, desc, key_var_num_args, ret_type = (ctypes.c_char_p() for _ in range(4))
    num_args = mx_uint()
    arg_names, arg_types, arg_descs = (ctypes.POINTER(ctypes.c_char_p)() for _ in range(3))
    check_call(LIB.MXSymbolGetAtomicSymbolInfo(
        ctypes.c_void_p(handle), ctypes.byref(real_name), ctypes.byref(desc),
        ctypes.byref(num_args), ctypes.byref(arg_names), ctypes.byref(arg_types),
        ctypes.byref(arg_descs), ctypes.byref(key_var_num_args), ctypes.byref(ret_type)))
    arguments = tuple((py_str(arg_names[i]), py_str(arg_types[i]))
                      for i in range(num_args.value))
    return py_str(real_name.value), arguments, py_str(key_var_num_args.value or b"")


# --------------------------------------------------------------------- classes and symbols
_uses("mxnet.symbol.numpy", "_Symbol")
#: The Symbol class of the numpy interface (``mx.sym.np``).
NumpySymbol = mx.sym.numpy._Symbol

_uses("mxnet.symbol.Symbol", "_gen_atomic_symbol")


def rebuild_symbol(sym, inputs, name):
    """A new node of ``sym``'s operator, with its attributes, on other ``inputs``.

    >>> s = mx.sym.relu(mx.sym.var('x'), name='r')
    >>> rebuild_symbol(s, [mx.sym.var('y')], 'r2').list_inputs()
    ['y']
    """
    return sym._gen_atomic_symbol()(*inputs, name=name)


_uses("mxnet.autograd", "_RecordingStateScope")
_uses("mxnet.autograd._RecordingStateScope", "_enter_is_record")
#: The context manager behind ``autograd.record()``/``pause()``: mxamp hooks its enter/exit.
RecordingScope = mx.autograd._RecordingStateScope


def scope_starts_recording(scope):
    """True when entering ``scope`` (a :data:`RecordingScope`) turns recording on."""
    return bool(scope._enter_is_record)


_uses("mxnet.contrib.amp.amp", "_amp_initialized")


@functools.lru_cache(maxsize=None)
def reference_amp_module():
    """The reference's module ``mxnet.contrib.amp.amp``, whose ``_amp_initialized`` flag
    GluonNLP's attention cell reads (``amp.init`` sets it through mxamp's patch registry).
    Found once, at ``import mxamp``: after ``mxamp.install()`` the name means mxamp's ``amp``.

    >>> reference_amp_module()._amp_initialized in (False, True)
    True
    """
    from mxnet.contrib.amp import amp as reference  # pylint: disable=import-outside-toplevel
    return reference


def set_optimizer_device(optimizer, device_id):
    """Tell an optimizer which device's state it updates (its update kernels read it)."""
    optimizer._set_current_context(device_id)


_uses("mxnet.optimizer.Optimizer", "_set_current_context")


def update_count(optimizer, index):
    """``(the updates counted for index or None, the optimizer's num_update)``: what one
    ``optimizer.update(index, ...)`` advances, for :func:`restore_update_count`.

    >>> import mxnet as mx
    >>> update_count(mx.optimizer.SGD(), 3)
    (None, 0)
    """
    return optimizer._index_update_count.get(index), optimizer.num_update


def restore_update_count(optimizer, index, counted):
    """Put back what :func:`update_count` read, so that a weight updated in several calls
    (a slice each) advances the optimizer's counts once.

    >>> import mxnet as mx
    >>> sgd = mx.optimizer.SGD(); before = update_count(sgd, 0)
    >>> sgd.update(0, mx.nd.ones((2,)), mx.nd.ones((2,)), None); update_count(sgd, 0)
    (1, 1)
    >>> restore_update_count(sgd, 0, before); update_count(sgd, 0)
    (None, 0)
    """
    count, num_update = counted
    if count is None:
        optimizer._index_update_count.pop(index, None)
    else:
        optimizer._index_update_count[index] = count
    optimizer.num_update = num_update


_uses("mxnet.optimizer.Optimizer", "_index_update_count")


def has_fresh_grad(data):
    """True when backward wrote the gradient of parameter array ``data`` since the last step
    (``Trainer.step`` updates only those with ``ignore_stale_grad=True``, else it raises)."""
    return bool(data._fresh_grad)


def consume_fresh_grads(params):
    """Mark the gradients of ``params`` as used, as ``Trainer.step`` does for those it applies:
    a skipped step's gradients are not fresh at the next step."""
    for param in params:
        if param.grad_req != "null" and ParamView(param).data is not None:
            for data in param.list_data():
                data._fresh_grad = False


_uses("mxnet.ndarray.NDArray", "_fresh_grad")


def share_update_counts(optimizer, device_ids):
    """Give each of ``device_ids`` every weight's update count, the highest any device has:
    a kvstore counts each weight on the one device that updated it, per-device updaters
    count on their own (Adam's bias correction reads it)."""
    counts = optimizer._all_index_update_counts
    merged = {}
    for per_device in counts.values():
        for index, count in per_device.items():
            merged[index] = max(count, merged.get(index, count))
    for device_id in device_ids:
        counts[device_id] = dict(merged)
    optimizer._set_current_context(device_ids[0])   # the current count is one of these dicts


_uses("mxnet.optimizer.Optimizer", "_all_index_update_counts")


# ----------------------------------------------------------------------------------- views
def convolution_groups(block):
    """``num_group`` of a Gluon convolution layer (1 for any other block).

    >>> convolution_groups(mx.gluon.nn.Conv2D(8, 3, groups=8, in_channels=8))
    8
    """
    return int(getattr(block, "_kwargs", {}).get("num_group", 1))


def is_hybridized(block):
    """True when ``block`` runs a cached graph (``hybridize()`` was called on it).

    >>> net = mx.gluon.nn.Dense(2); net.hybridize(); is_hybridized(net)
    True
    """
    return bool(getattr(block, "_active", False))


class _Attribute:
    """A property of a view that reads and writes one private attribute of the viewed object."""

    def __init__(self, private_name):
        self.private_name = private_name

    def __set_name__(self, owner, name):
        owner.FIELDS = dict(getattr(owner, "FIELDS", {}), **{name: self.private_name})

    def __get__(self, view, owner=None):
        if view is None:
            return self
        return getattr(view.obj, self.private_name)

    def __set__(self, view, value):
        setattr(view.obj, self.private_name, value)


class _View:
    OWNER = ""
    FIELDS = {}       # view property -> private attribute (filled by _Attribute)
    METHODS = ()      # private methods the view calls

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj


class TrainerView(_View):
    """The private state of a ``gluon.Trainer`` that loss scaling hooks into.

    MXNet's ``Trainer._update`` calls ``_amp_loss_scaler.has_overflow(params)`` and divides
    gradients by ``_scale``; ``_amp_original_scale`` is the reference's name for the scale
    the user's ``rescale_grad`` gave.
    """

    OWNER = "mxnet.gluon.Trainer"
    METHODS = ("_init_kvstore", "_reset_kvstore", "_init_params", "_update")
    params = _Attribute("_params")
    param2idx = _Attribute("_param2idx")
    updaters = _Attribute("_updaters")
    optimizer = _Attribute("_optimizer")
    scale = _Attribute("_scale")
    contexts = _Attribute("_contexts")
    kvstore = _Attribute("_kvstore")
    kvstore_params = _Attribute("_kvstore_params")
    kv_initialized = _Attribute("_kv_initialized")
    update_on_kvstore = _Attribute("_update_on_kvstore")
    contains_sparse_weight = _Attribute("_contains_sparse_weight")
    contains_sparse_grad = _Attribute("_contains_sparse_grad")
    params_to_init = _Attribute("_params_to_init")
    amp_loss_scaler = _Attribute("_amp_loss_scaler")
    amp_original_scale = _Attribute("_amp_original_scale")

    def amp_scaler_or_none(self):
        """The object at ``_amp_loss_scaler``, or None before ``init_trainer``."""
        return getattr(self.obj, "_amp_loss_scaler", None)

    def has_original_scale(self):
        return hasattr(self.obj, "_amp_original_scale")

    def init_kvstore(self):
        self.obj._init_kvstore()

    def reset_kvstore(self):
        self.obj._reset_kvstore()

    def init_params(self):
        self.obj._init_params()


class KVStoreView(_View):
    """The private parts of a kvstore: its barrier, and the updater of a local store."""

    OWNER = "mxnet.kvstore.KVStore"
    METHODS = ("_barrier",)
    updater = _Attribute("_updater")

    def barrier(self):
        self.obj._barrier()


def flat_block_inputs(args):
    """A block call's inputs, nested lists flattened and None left out, in the order Gluon
    names its graph's input variables (``data``, or ``data0``, ``data1``, ...).

    >>> flat_block_inputs((1, [2, None, (3,)]))
    [1, 2, 3]
    """
    flat = []

    def walk(value):
        if isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif value is not None:
            flat.append(value)
    walk(args)
    return flat


class BlockView(_View):
    """The private state of a (Hybrid)Block: its children, parameters and cached graph."""

    OWNER = "mxnet.gluon.HybridBlock"
    METHODS = ("_clear_cached_op", "_get_graph", "_call_cached_op", "_build_cache")
    children = _Attribute("_children")
    own_params = _Attribute("_reg_params")
    cached_graph = _Attribute("_cached_graph")
    cached_op = _Attribute("_cached_op")
    flags = _Attribute("_flags")   # hybridize()'s options, passed to the graph it builds

    def clear_cached_op(self):
        """Drop the cached graph: the next call builds it again."""
        self.obj._clear_cached_op()

    def trace(self, *inputs):
        """``(input symbols, output symbol)`` traced from ``hybrid_forward`` on ``inputs``."""
        return self.obj._get_graph(*inputs)


#: The HybridBlock method that runs (and first builds) the cached graph: mxamp wraps it to
#: rebuild graphs made under another AMP generation (see mxamp.patching.patcher).
BLOCK_CALL_METHOD = "_call_cached_op"
#: The HybridBlock method that builds the cached graph (once per graph, not per call).
BLOCK_BUILD_METHOD = "_build_cache"
#: The Parameter method that averages its contexts' arrays (``save_parameters``).
PARAM_REDUCE_METHOD = "_reduce"


class ParamView(_View):
    """The private state of a ``gluon.Parameter``: its arrays, dtype and deferred init."""

    OWNER = "mxnet.gluon.Parameter"
    METHODS = ("_reduce", "_load_init", "_finish_deferred_init")
    data = _Attribute("_data")
    grad = _Attribute("_grad")
    dtype = _Attribute("_dtype")
    var = _Attribute("_var")   # the Symbol variable graphs use, declared with the dtype
    deferred_init = _Attribute("_deferred_init")

    def reduce(self):
        """The parameter's value as one array (averaged over contexts)."""
        return self.obj._reduce()

    def load(self, value, contexts):
        """Set the value on ``contexts``, completing deferred initialisation."""
        self.obj._load_init(value, contexts)

    def finish_deferred_init(self):
        """Allocate and initialise a parameter whose shape is now known."""
        self.obj._finish_deferred_init()


class BucketingView(_View):
    """What ``convert_bucketing_module`` copies from a ``mod.BucketingModule``."""

    OWNER = "mxnet.module.BucketingModule"
    buckets = _Attribute("_buckets")
    sym_gen = _Attribute("_sym_gen")
    context = _Attribute("_context")
    default_bucket_key = _Attribute("_default_bucket_key")
    work_load_list = _Attribute("_work_load_list")
    fixed_param_names = _Attribute("_fixed_param_names")
    state_names = _Attribute("_state_names")
    group2ctxs = _Attribute("_group2ctxs")
    compression_params = _Attribute("_compression_params")


VIEWS = (TrainerView, KVStoreView, BlockView, ParamView, BucketingView)
for _view in VIEWS:
    _uses(_view.OWNER, *(list(_view.FIELDS.values()) + list(_view.METHODS)))
