"""The one operator registry: names, aliases, handles, and the functions MXNet made for them.

MXNet 1.x registers each operator under one real name and maybe some aliases (``flatten`` is
``Flatten``; ``_npx_fully_connected`` is ``FullyConnected``), and generates one Python function
per registered name and namespace (``mx.nd``, ``mx.sym``, their ``op``/``_internal``/
``contrib``/``linalg``/``sparse``/``random``/``image`` submodules, and the numpy interface's
modules behind ``mx.np`` and ``mx.npx``). Each generated function embeds its operator's handle
as a constant, which is how a function is mapped to its operator without re-implementing
MXNet's naming rules.

Every entry point (``amp.init``, each ``convert_*``, ``cast_model``, the op lists' command line)
resolves operator names here, so an alias means the same thing everywhere; names are checked
by :func:`check_op_names`. The registry is a fact of the loaded libmxnet: computed once, on
first use, and never reset.

>>> from mxamp.backend import registry as opfuncs
>>> opfuncs.canonical_name('flatten')
'Flatten'
"""
import collections
import difflib
import functools
import sys
import types
from dataclasses import dataclass

import mxnet as mx  # noqa: F401 (the doctests use it)

from mxamp.backend import mxnet_private as mxp
from mxamp.errors import AmpArgumentError

#: Module name prefixes whose generated operator functions AMP wraps.
NAMESPACE_PREFIXES = ("mxnet.ndarray", "mxnet.symbol", "mxnet.numpy", "mxnet.numpy_extension")
#: The file name of code that MXNet compiles at import to make the operator functions.
_GENERATED = "<string>"


@dataclass(frozen=True)
class RegisteredOps:
    """Operator names known to libmxnet: every alias and its canonical name."""

    names: frozenset          # all registered names, aliases included
    canonical: dict           # any name -> canonical name
    by_handle: dict           # op handle (int) -> canonical name
    aliases: dict             # canonical name -> frozenset of all its names


@functools.lru_cache(maxsize=None)
def _handles():
    """Every registered name -> its operator handle (one cheap C call per name, ~4 ms)."""
    return {name: mxp.op_handle(name) for name in mxp.list_op_names()}


@functools.lru_cache(maxsize=None)
def _known_handles():
    return frozenset(_handles().values())


@functools.lru_cache(maxsize=None)
def registered_ops():
    """The :class:`RegisteredOps` of the loaded libmxnet (computed once, ~10 ms).

    >>> 'FullyConnected' in registered_ops().names
    True
    """
    canonical, by_handle, aliases = {}, {}, {}
    for name, handle in _handles().items():
        canon = by_handle.get(handle)
        if canon is None:
            canon = by_handle[handle] = _name_of_handle(handle)
        canonical[name] = canon
        aliases.setdefault(canon, set()).add(name)
    return RegisteredOps(names=frozenset(canonical), canonical=canonical, by_handle=by_handle,
                         aliases={k: frozenset(v) for k, v in aliases.items()})


def canonical_name(name):
    """The real name of the operator registered as ``name`` (itself for a canonical name).

    >>> canonical_name('_npx_fully_connected')
    'FullyConnected'
    """
    return registered_ops().canonical.get(name, name)


def check_op_names(names, what):
    """Raise :class:`~mxamp.errors.AmpArgumentError` for names no operator is registered under.

    The one validator of operator names, for every entry point; the message names the
    argument, the unknown names and the closest registered ones.

    >>> check_op_names(['softmax', 'Softmax'], 'fp32_ops')
    >>> check_op_names(['sotfmax'], 'fp32_ops')
    Traceback (most recent call last):
    ...
    mxamp.errors.AmpArgumentError: fp32_ops: not registered MXNet operators: sotfmax (did you mean softmax?); amp.list_lp16_ops(), amp.list_fp32_ops() and mx.operator.get_all_registered_operators() list valid names
    """
    known = registered_ops().names
    unknown = sorted(set(names) - known)
    if not unknown:
        return
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1)
        hints.append(name + (" (did you mean %s?)" % close[0] if close else ""))
    raise AmpArgumentError(
        "%s: not registered MXNet operators: %s; amp.list_lp16_ops(), amp.list_fp32_ops() and "
        "mx.operator.get_all_registered_operators() list valid names" % (what, ", ".join(hints)))


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
    handle = mxp.op_handle(name)
    canonical, arguments, key_var_num_args = mxp.op_arguments(handle)
    return OpInfo(handle, canonical, arguments, key_var_num_args)


class OpFunction(collections.namedtuple("OpFunction", "func op_name is_symbol bindings")):
    """One generated operator function (``func``), the canonical op it runs (``op_name``),
    whether it builds Symbols (``is_symbol``) and its ``[(module, attribute)]`` bindings.

    A named tuple: thousands are made at every ``amp.init``.
    """

    __slots__ = ()


def _embedded_handle(code, known):
    """The operator handle a generated function's ``code`` embeds (one of ``known``), or None."""
    for const in code.co_consts:
        if type(const) is int and const in known:  # pylint: disable=unidiomatic-typecheck
            return const
    return None


def op_function_name(func):
    """The canonical operator a generated function invokes, or None for other functions.

    >>> op_function_name(mx.nd.flatten)
    'Flatten'
    """
    code = getattr(func, "__code__", None)
    if code is None or code.co_filename != _GENERATED:
        return None
    handle = _embedded_handle(code, _known_handles())
    return _name_of_handle(handle) if handle is not None else None


@functools.lru_cache(maxsize=None)
def _name_of_handle(handle):
    return mxp.op_name(handle)    # only ever called with a registered handle


def find_op_functions():
    """Every generated operator function bound in MXNet's operator namespaces.

    A function bound under several names (``mx.nd.relu`` and ``mx.nd.op.relu``) is listed once
    with all its bindings, so that it is wrapped once. Only functions MXNet compiled from
    generated code are looked at, and each distinct handle is named once (a cheap C call).

    >>> fns = find_op_functions()
    >>> any(f.op_name == 'FullyConnected' and f.is_symbol for f in fns)
    True
    """
    found = {}                      # id(function) -> [function, op name, is_symbol, bindings]
    known, names = _known_handles(), _name_of_handle
    function_type = types.FunctionType
    for mod_name, module in list(sys.modules.items()):
        if module is None or not mod_name.startswith(NAMESPACE_PREFIXES):
            continue
        is_symbol_module = ".symbol" in mod_name
        for attr, value in list(vars(module).items()):
            if type(value) is not function_type:  # pylint: disable=unidiomatic-typecheck
                continue
            entry = found.get(id(value))
            if entry is not None:
                entry[3].append((module, attr))
                continue
            code = value.__code__
            if code.co_filename != _GENERATED:
                continue
            handle = _embedded_handle(code, known)
            if handle is None:
                continue
            is_symbol = is_symbol_module or value.__module__.startswith(("symbol",
                                                                         "mxnet.symbol"))
            found[id(value)] = [value, names(handle), is_symbol, [(module, attr)]]
    return [OpFunction(*entry) for entry in found.values()]


@functools.lru_cache(maxsize=None)
def op_functions():
    """:func:`find_op_functions`, computed once: MXNet generates its operator functions at
    ``import mxnet``, so the answer is a fact of the process (``import mxamp`` computes it, and
    ``amp.init`` checks that each binding still holds the function before replacing it).

    >>> op_functions() is op_functions()
    True
    """
    return tuple(find_op_functions())
