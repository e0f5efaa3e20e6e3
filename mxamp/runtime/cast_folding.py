"""Cast round trips folded out of the graphs of models cast by ``cast_model`` (O2).

O2 keeps activations in the target dtype, so each layer that computes in float32 (a float32
island, or a layer the CPU class's shape rules keep in float32) widens its input and rounds its
output back. Where two such layers meet, directly or through operators that only select, move
or combine data (ReLU, Concat, Reshape, slice_axis, SwapAxis, add), the graph rounds a float32
value to the target and widens it again, forward and backward. GluonCV's ShuffleNet V2, whose
58/116/232-channel layers all train in float32 on the classes without AMX, ran 611 ``amp_cast``
a training step that way (17 of 117 ms of operator time, mx.profiler, batch 8 at 112 px on a
Zen 4), and O2 trained it at 0.68x float32.

:func:`fold_round_trips` computes such a stretch in float32: the rounding at its entry moves to
the places where its values leave for an operator that takes the target dtype, and the widening
casts go. A BatchNorm reading a rounding ends a stretch: it computes on the float32 value (its
kernels take either dtype beside float32 parameters) and its output is rounded. The values
computed change only by the roundings removed (the folded stretch computes what float32
would), and the folded graph holds less: no rounded copy beside its float32 value.

>>> import mxnet as mx
>>> from mxamp.runtime.casting import cast
>>> x = mx.sym.var('x', dtype='float32')
>>> y = cast(mx.sym.relu(cast(mx.sym.exp(x), 'bfloat16')), 'float32')
>>> [n['op'] for n in json.loads(fold_round_trips(y, 'bfloat16').tojson())['nodes']]
['null', 'exp', 'relu']
"""
import json

from mxamp import dtypes
from mxamp.backend import mxnet_private as mxp
from mxamp.lists import get_op_lists
from mxamp.runtime.graph_edits import consumers_of, data_dtypes, input_dtypes, symbol_of

#: Where ``cast_model`` leaves the dtype whose round trips its model's graphs fold.
FOLD_ATTR = "_mxamp_fold_round_trips"
#: The name each moved rounding gets: the node it reads, the output index and this suffix.
FOLD_SUFFIX = "_mxamp_fold"
#: Normalisations whose kernels take data of any float dtype beside float32 parameters
#: (``cast_model`` keeps those): one reading a rounding computes in float32 and the rounding
#: moves after it, as BatchNorm in bfloat16 on plain data runs oneDNN's ncsp_bnorm at 3-4x
#: its float32 time (MobileNetV3-Small's BatchNorms after its float32 stem, Zen 4).
MIXED_INPUT_NORMS = frozenset(("BatchNorm", "_contrib_BatchNormWithReLU"))
#: Ops the op lists classify that are casts themselves (``amp_multicast`` of float32 inputs
#: is float32, so it folds; an explicit cast stays as written).
_CASTS = frozenset(("amp_cast", "Cast", "cast", "_npi_cast", "_npx_cast"))


def _foldable_ops(target):
    """Ops that may compute in float32 on float32 inputs: all that the op lists do not cast
    to the target (neutral, widest, float32 and conditionally float32 ones)."""
    lists = get_op_lists(target)
    return (lists.neutral | lists.widest | lists.fp32 | frozenset(lists.conditional_fp32)) - _CASTS


def _casts_by_direction(graph, target, known_inputs):
    """({index of an amp_cast rounding float32 to ``target``}, {index of one widening
    ``target`` to float32}, {index of one to the dtype its input has already}), by MXNet's
    type inference of their inputs."""
    nodes = graph["nodes"]
    casts = [i for i, n in enumerate(nodes) if n["op"] == "amp_cast"]
    source = data_dtypes(graph, casts, known_inputs) if casts else {}
    to = {i: dtypes.name_of(nodes[i]["attrs"].get("dtype")) for i in casts}
    rounding = {i for i in casts if source.get(i) == "float32" and to[i] == target}
    widening = {i for i in casts if source.get(i) == target and to[i] == "float32"}
    identity = {i for i in casts if source.get(i) is not None and source.get(i) == to[i]}
    return rounding, widening, identity


def _stretches(graph, rounding, widening, foldable):
    """The nodes to compute in float32: ops whose every input is a rounding or another such
    op, and from which a widening cast or a normalisation reading float32 parameters
    (:data:`MIXED_INPUT_NORMS`) is reached through such ops."""
    nodes = graph["nodes"]
    reaches = set(rounding)
    sinks = set()
    for i, node in enumerate(nodes):
        if node["op"] in MIXED_INPUT_NORMS and node["inputs"] and node["inputs"][0][0] in reaches:
            sinks.add(i)
        elif node["op"] in foldable and node["inputs"] and \
                all(e[0] in reaches for e in node["inputs"]):
            reaches.add(i)
    consumers = consumers_of(nodes)
    useful = set(sinks)
    for i in reversed(range(len(nodes))):
        if i in reaches and any(c in widening or (c in useful and c not in rounding)
                                for c in consumers.get(i, ())):
            useful.add(i)
    return useful - rounding, useful & rounding


def fold_round_trips(sym, target, known_inputs=None):
    """``sym`` with its float32 -> ``target`` -> float32 round trips folded (see the module's
    docstring); ``sym`` itself where it has none. ``known_inputs``: the dtypes of the graph's
    data inputs (:func:`~mxamp.runtime.graph_edits.input_dtypes`), for type inference."""
    graph = json.loads(sym.tojson(remove_amp_cast=False))
    rounding, widening, identity = _casts_by_direction(graph, target, known_inputs or {})
    lifted, used_roundings = _stretches(graph, rounding, widening, _foldable_ops(target))
    if not used_roundings and not identity:
        return sym
    nodes, new_id, read_as, moved = [], {}, {}, {}
    folded_sources = lifted | used_roundings
    outputs = {h[0] for h in graph["heads"]}   # an output stays an operator's output

    def mapped(e):             # the new entry of an old one
        return read_as[e[0]] if e[0] in read_as else [new_id[e[0]]] + list(e[1:])

    def float32_entry(e):      # the float32 value behind an old entry
        if e[0] in used_roundings:
            return float32_entry(graph["nodes"][e[0]]["inputs"][0])
        return mapped(e)

    def target_entry(e):       # what an operator outside the stretches reads for an old entry
        if e[0] not in lifted:
            return mapped(e)
        key = (e[0], e[1])
        if key not in moved:
            name = "%s%d%s" % (graph["nodes"][e[0]]["name"], e[1], FOLD_SUFFIX)
            nodes.append({"op": "amp_cast", "name": name, "attrs": {"dtype": target},
                          "inputs": [[new_id[e[0]], e[1], 0]]})
            moved[key] = [len(nodes) - 1, 0, 0]
        return moved[key]

    for old_id, node in enumerate(graph["nodes"]):
        if old_id in widening and node["inputs"][0][0] in folded_sources:
            read_as[old_id] = float32_entry(node["inputs"][0])   # the widening goes
            continue
        if old_id in identity and node["inputs"][0][0] not in lifted and old_id not in outputs:
            read_as[old_id] = mapped(node["inputs"][0])   # a cast that changes nothing goes
            continue
        reader = float32_entry if old_id in lifted else target_entry
        inputs = [reader(e) for e in node["inputs"]]    # may add a moved rounding first
        new_id[old_id] = len(nodes)
        nodes.append(dict(node, inputs=inputs))
    heads = [target_entry(h) for h in graph["heads"]]
    return _load(graph, nodes, heads, sym)


def _load(graph, nodes, heads, like):
    """The Symbol of ``nodes`` and ``heads``, without the nodes no head reaches (roundings whose
    readers all folded), in ``like``'s interface."""
    keep, todo = set(), [h[0] for h in heads]
    while todo:
        i = todo.pop()
        if i not in keep:
            keep.add(i)
            todo.extend(e[0] for e in nodes[i]["inputs"])
    renumber = {old: new for new, old in enumerate(sorted(keep))}
    kept = [dict(nodes[i], inputs=[[renumber[e[0]]] + list(e[1:]) for e in nodes[i]["inputs"]])
            for i in sorted(keep)]
    return symbol_of(graph, kept, [[renumber[h[0]]] + list(h[1:]) for h in heads], like)


def build_folded_graph(block, args, target):
    """Fold the round trips to ``target`` out of the graph ``block`` builds for ``args``,
    before the other treatments (their casts steer layouts: a folded one would hand a
    BatchNorm its data in a convolution's 4-channel blocks again, as measured on ShuffleNet
    V1) and before MXNet builds its cached op from it."""
    if not target:
        return
    view = mxp.BlockView(block)
    inputs, out = view.trace(*args)
    folded = fold_round_trips(out, target, input_dtypes(inputs, args))
    if folded is not out:
        view.cached_graph = (inputs, folded)
