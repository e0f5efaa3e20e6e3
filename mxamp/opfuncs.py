"""Find the Python functions MXNet generated for its operators, in every namespace.

MXNet 1.x generates one Python function per registered operator and namespace (``mx.nd``,
``mx.sym``, their ``op``/``_internal``/``contrib``/``linalg``/``sparse``/``random``/``image``
submodules, and the numpy interface's ``_internal``/``_op`` modules behind ``mx.np`` and
``mx.npx``). Each generated function embeds its operator's handle as a constant, which is how
this module maps a function to its operator without re-implementing MXNet's naming rules.

>>> from mxamp import opfuncs
>>> ops = opfuncs.registered_ops()
>>> ops.canonical['flatten']
'Flatten'
"""
import ctypes
import functools
import sys
import types
from dataclasses import dataclass

import mxnet as mx
from mxnet.base import _LIB, c_str, check_call, mx_uint, py_str

#: Module name prefixes whose generated operator functions AMP wraps.
NAMESPACE_PREFIXES = ("mxnet.ndarray", "mxnet.symbol", "mxnet.numpy", "mxnet.numpy_extension")


@dataclass(frozen=True)
class RegisteredOps:
    """Operator names known to libmxnet: every alias and its canonical name."""

    names: frozenset          # all registered names, aliases included
    canonical: dict           # any name -> canonical name
    by_handle: dict           # op handle (int) -> canonical name
    aliases: dict             # canonical name -> frozenset of all its names


_REGISTERED = None


def registered_ops():
    """The :class:`RegisteredOps` of the loaded libmxnet (computed once).

    >>> 'FullyConnected' in registered_ops().names
    True
    """
    global _REGISTERED
    if _REGISTERED is None:
        size = mx_uint()
        plist = ctypes.POINTER(ctypes.c_char_p)()
        check_call(_LIB.MXListAllOpNames(ctypes.byref(size), ctypes.byref(plist)))
        names = [py_str(plist[i]) for i in range(size.value)]
        canonical, by_handle, aliases = {}, {}, {}
        for name in names:
            info = op_info(name)
            canon = by_handle.setdefault(info.handle, info.canonical)
            canonical[name] = canon
            aliases.setdefault(canon, set()).add(name)
        _REGISTERED = RegisteredOps(
            names=frozenset(names), canonical=canonical, by_handle=by_handle,
            aliases={k: frozenset(v) for k, v in aliases.items()})
    return _REGISTERED


@dataclass(frozen=True)
class OpInfo:
    """What libmxnet says about one registered operator name."""

    handle: int
    canonical: str               # the op's real name (aliases share it)
    arguments: tuple             # ((argument name, type description), ...)
    key_var_num_args: str        # name of the parameter counting variadic inputs, or ''


def op_info(name):
    """Handle, canonical name and arguments of the operator registered as ``name``.

    >>> op_info('flatten').canonical
    'Flatten'
    """
    handle = ctypes.c_void_p()
    check_call(_LIB.NNGetOpHandle(c_str(name), ctypes.byref(handle)))
    real_name, desc, key_var_num_args, ret_type = (ctypes.c_char_p() for _ in range(4))
    num_args = mx_uint()
    arg_names, arg_types, arg_descs = (ctypes.POINTER(ctypes.c_char_p)() for _ in range(3))
    check_call(_LIB.MXSymbolGetAtomicSymbolInfo(
        handle, ctypes.byref(real_name), ctypes.byref(desc), ctypes.byref(num_args),
        ctypes.byref(arg_names), ctypes.byref(arg_types), ctypes.byref(arg_descs),
        ctypes.byref(key_var_num_args), ctypes.byref(ret_type)))
    arguments = tuple((py_str(arg_names[i]), py_str(arg_types[i])) for i in range(num_args.value))
    return OpInfo(handle.value, py_str(real_name.value), arguments,
                  py_str(key_var_num_args.value or b""))


@dataclass(frozen=True)
class OpFunction:
    """One generated operator function and where it is bound."""

    func: types.FunctionType
    op_name: str               # canonical operator name
    is_symbol: bool            # builds Symbols (mx.sym...) rather than running on NDArrays
    bindings: tuple            # ((module, attribute name), ...) where the function is bound


def op_function_name(func):
    """The canonical operator a generated function invokes, or None for other functions.

    >>> op_function_name(mx.nd.flatten)
    'Flatten'
    """
    return _op_of(func, registered_ops().by_handle)


def _op_of(func, by_handle):
    code = getattr(func, "__code__", None)
    if code is None:
        return None
    for const in code.co_consts:
        if type(const) is int and const in by_handle:  # pylint: disable=unidiomatic-typecheck
            return by_handle[const]
    return None


def find_op_functions():
    """Every generated operator function bound in MXNet's operator namespaces.

    A function bound under several names (``mx.nd.relu`` and ``mx.nd.op.relu``) is listed once
    with all its bindings, so that it is wrapped once.

    >>> fns = find_op_functions()
    >>> any(f.op_name == 'FullyConnected' and f.is_symbol for f in fns)
    True
    """
    found = {}
    by_handle = registered_ops().by_handle
    for mod_name, module in sorted(sys.modules.items()):
        if module is None or not mod_name.startswith(NAMESPACE_PREFIXES):
            continue
        for attr, value in list(vars(module).items()):
            if not isinstance(value, types.FunctionType):
                continue
            key = id(value)
            if key in found:
                found[key][3].append((module, attr))
                continue
            op_name = _op_of(value, by_handle)
            if op_name is None:
                continue
            is_symbol = ".symbol" in mod_name or value.__module__.startswith(("symbol",
                                                                                "mxnet.symbol"))
            found[key] = [value, op_name, is_symbol, [(module, attr)]]
    return [OpFunction(func=f, op_name=o, is_symbol=s, bindings=tuple(b))
            for f, o, s, b in found.values()]


@functools.lru_cache(maxsize=None)
def gpu_available():
    """True when this process can run GPU kernels (decides fp16 ops in Symbols on CPU).

    >>> isinstance(gpu_available(), bool)
    True
    """
    try:
        return mx.context.num_gpus() > 0
    except mx.base.MXNetError:
        return False
