"""How MXNet's graphs share and free their arrays' storage: its memory planner and its bulked
backward segments.

* :func:`search_storage_plans` (at ``import mxamp``): MXNet plans each graph's memory when it
  first runs it at a shape (nnvm's ``PlanMemory`` pass: a hybridized block's forward and
  backward graphs, a Module's executor, on any device). Arrays whose lives do not overlap
  share a storage block: a free block serves any array whose element count is within a
  factor of ``NNVM_EXEC_MATCH_RANGE`` (default 16) of its own, and grows to the largest array
  it served; the plan counts every element as 4 bytes, whatever its dtype. Under AMP a graph
  mixes float32 and 16-bit arrays of very different sizes, so small arrays take blocks that
  large ones grew, and hold them: in a bfloat16 MLP's backward pass a 2 MB activation
  gradient held an 8 MB block that a weight gradient had grown, beside the next weight
  gradient. With ``NNVM_AUTO_SEARCH_MATCH_RANGE=1`` MXNet plans each graph with the ranges 1,
  2, 4, 8 and 16 and keeps the plan whose blocks add up to least, so by its own count no plan
  allocates more than MXNet's default. MXNet's storage in a training step on the Zen 4
  (dynamic graphs, ``hybridize()``'s default; MB, range 16 against the search): ResNet-50
  765 against 732 under ``amp.init``, 732 against 697 under O2, 1540 against 1471 in
  float32; the MLP 79 against 69; the Transformer block 154 against 146, float32 312
  against 288; MobileNet alike. Resident peaks, order-balanced processes (16, search,
  search, 16): ResNet-50 1424-1452 against 1387-1403 MB, O2 1373-1386 against 1337-1347;
  the MLP 642-657 against 620-635 (float32 588-618); the Transformer block alike; steps as
  fast within this machine's noise (``benchmark/results/native-amd-epyc-zen4/
  storage-plans-a0564f3.md``). A range of 1 alone saved more in dynamic graphs (ResNet-50
  O2 1265-1287 MB), but where ``hybridize(static_alloc=True)`` allocates every block up front
  it cost the Transformer block 38-44 MB, where the search cost at most 4.
  MXNet reads both variables each time it plans a graph; ``import mxamp`` sets the search
  before any graph runs. The planner is the same for CPU and GPU graphs, so a GPU's float16
  graphs get the same search (unmeasured on a GPU). Set either variable yourself to keep
  your own (``NNVM_AUTO_SEARCH_MATCH_RANGE=0`` keeps MXNet's default).
* :func:`backward_segment_flags` (the graphs without convolutions that AMP builds for the CPU):
  MXNet runs a training backward pass in bulked segments of up to 15 operators
  (``MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD``), and an array the pass no longer needs is
  freed only when its segment ends. Under AMP each layer's low-precision weight gradient
  waits there for the cast that writes it into the float32 gradient, so several coexist: a
  bfloat16 MLP's backward pass grew MXNet's storage by 44 MB with 15 operators per segment
  and by 22 MB with one. Resident peaks on the Zen 4, ``amp.init``, order-balanced processes
  (15, 1, 1, 15, three cycles): the MLP 661-681 MB against 649-658 (float32 plus the bfloat16
  weight copies: 650-657), the Transformer block 587-624 against 562-579 (O2 576-619 against
  557-569), steps alike; a chain of 100 small Dense layers took 3.40 against 3.47 ms a step. On
  ResNet-50, in an order-balanced series (three cycles of 15, 1, 1, 15), segments of one cost
  about 2% of the step (2432 against 2478 ms under ``amp.init``, 2434 against 2491 under O2)
  and saved 0-10 MB, so graphs with convolutions keep MXNet's segments
  (``benchmark/results/native-amd-epyc-zen4/backward-segments-de53e48.md``). A GPU waits for
  its stream at the end of each segment (MXNet 1.9's ``PushFCompute``,
  ``src/imperative/imperative_utils.h``, waits after every operator that does not run in a
  bulk segment), so segments of one would stall a GPU's queue at every operator; graphs
  whose inputs are not on the CPU keep MXNet's segments (unmeasured on a GPU: this
  project's machines have none). Everything else above holds on a GPU as on the CPU.
"""
from mxamp.backend import env

_MATCH_RANGE = "NNVM_EXEC_MATCH_RANGE"
_PLAN_SEARCH = "NNVM_AUTO_SEARCH_MATCH_RANGE"


def storage_plans(environ=None):
    """How MXNet's memory planner matches arrays to storage blocks in this process, in words,
    and who chose it.

    >>> storage_plans(environ={})
    "NNVM_AUTO_SEARCH_MATCH_RANGE unset: MXNet's default, one plan with NNVM_EXEC_MATCH_RANGE (16)"
    >>> storage_plans(environ={'NNVM_EXEC_MATCH_RANGE': '4'})
    'NNVM_EXEC_MATCH_RANGE=4, yours'
    """
    if env.value(_PLAN_SEARCH, environ) is None and env.value(_MATCH_RANGE, environ) is not None:
        return "%s=%s, yours" % (_MATCH_RANGE, env.value(_MATCH_RANGE, environ))
    return env.in_force(_PLAN_SEARCH, "MXNet's default, one plan with %s (16)" % _MATCH_RANGE,
                        environ)


def search_storage_plans(environ=None):
    """Set ``NNVM_AUTO_SEARCH_MATCH_RANGE=1`` where neither it nor ``NNVM_EXEC_MATCH_RANGE`` is
    set (see the module's docstring); returns what it did, in words ('' when it left MXNet
    alone).

    >>> search_storage_plans(environ={'NNVM_EXEC_MATCH_RANGE': '16'})
    ''
    >>> e = {}; search_storage_plans(environ=e); e
    'NNVM_AUTO_SEARCH_MATCH_RANGE=1 (MXNet keeps the graph memory plan, of match ranges 1 to 16, that allocates least)'
    {'NNVM_AUTO_SEARCH_MATCH_RANGE': '1'}
    """
    if env.value(_MATCH_RANGE, environ) is not None or \
            env.value(_PLAN_SEARCH, environ) is not None:
        return ""
    return env.choose(_PLAN_SEARCH, 1, "MXNet keeps the graph memory plan, of match ranges 1 "
                      "to 16, that allocates least", environ)


#: Operators per segment of MXNet's bulked backward pass where mxamp chooses: one, so that
#: each array the pass frees goes when its last reader has run.
BACKWARD_SEGMENT_OPS = 1
_BACKWARD_BULK = "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN_BWD"
#: MXNet's variables for bulked execution in training: one the user set keeps mxamp out.
BULK_VARIABLES = (_BACKWARD_BULK, "MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN",
                  "MXNET_EXEC_BULK_EXEC_TRAIN")


def _users_bulk_variable(environ):
    """The first of :data:`BULK_VARIABLES` set in ``environ``, or None."""
    return next((name for name in BULK_VARIABLES if env.value(name, environ) is not None), None)


def backward_segments(environ=None):
    """MXNet's backward segments in this process, in words, and who chose them.

    >>> backward_segments(environ={})
    "MXNet's default, 15 operators; 1 in the graphs without convolutions that AMP builds for the CPU"
    >>> backward_segments(environ={'MXNET_EXEC_BULK_EXEC_TRAIN': '0'})
    'MXNET_EXEC_BULK_EXEC_TRAIN=0, yours'
    """
    chosen = _users_bulk_variable(environ)
    if chosen is not None:
        return "%s=%s, yours" % (chosen, env.value(chosen, environ))
    return ("MXNet's default, 15 operators; %d in the graphs without convolutions that AMP "
            "builds for the CPU" % BACKWARD_SEGMENT_OPS)


def backward_segment_flags(flags, environ=None):
    """A hybridized block's graph ``flags`` (``(name, value)`` pairs, as ``hybridize()``
    keeps them) with :data:`BACKWARD_SEGMENT_OPS` added, where neither the block's
    ``hybridize(backward_bulk_size=...)`` nor a variable the user set chose a size.

    >>> backward_segment_flags([('static_alloc', False)], environ={})
    [('static_alloc', False), ('backward_bulk_size', 1)]
    >>> backward_segment_flags([('backward_bulk_size', 15)], environ={})
    [('backward_bulk_size', 15)]
    >>> backward_segment_flags([], environ={'MXNET_EXEC_BULK_EXEC_MAX_NODE_TRAIN': '30'})
    []
    """
    if any(name == "backward_bulk_size" for name, _ in flags) or \
            _users_bulk_variable(environ) is not None:
        return list(flags)
    return list(flags) + [("backward_bulk_size", BACKWARD_SEGMENT_OPS)]
