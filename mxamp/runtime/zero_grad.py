"""Recorded casts keep what they cast: a zero gradient arriving at a cast crashed backward.

MXNet 1.9.1's imperative autograd keeps an op's input for backward only when the op's gradient
function (``FGradient``), called once at record time with a placeholder output gradient, refers
to it. The casts (``amp_cast``, ``Cast``) keep nothing: their gradient ignores their data. But
when a cast's output gradient turns out to be zero (``zeros_like``: the cast feeds only a
comparison, ``argmax``, ``one_hot``, numpy ``var``, the condition of ``where``, or a chain that
ends in one), ``MakeNonlossGradNode`` returns ``zeros_like(input)``: a node that reads the input
the cast never kept. Where that input came from an op whose backward always runs and does not
keep its own output (``FullyConnected``, ``Convolution``, ...), ``Imperative::Backward`` feeds
the empty placeholder to ``zeros_like`` and ``SetDependency`` dereferences it: "Segmentation
fault" at ``loss.backward()`` (``src/imperative/imperative.cc``, ``operator_common.h``).

Without AMP the comparison itself keeps the Dense output and backward runs; under ``amp.init``
the array it keeps is AMP's cast, and the Dense output behind it is lost: a hard gate
``(dense(x) > 0) * v``, top-1 routing ``one_hot(argmax(dense(x)))``, ``np.var(dense(x))`` and
``abs(dense(x)) > t`` all crashed. So every cast mxamp records keeps the array it casts
(:func:`keep_for_backward`, called by :func:`mxamp.runtime.casting.cast`: the patched ops'
casts and bfloat16 ``astype`` alike). Gradients do not change (the same models hybridized,
whose graphs keep every array, give the same ones bit for bit). Hybridized blocks run their
graph, not these casts. The cost, measured on a Zen 4 training imperative models under
``amp.init('bfloat16')`` (4 steps, peak RSS, two processes each, ``OMP_NUM_THREADS=2``),
keeping only the arrays cast for zero-gradient inputs -> keeping every cast's: Transformer
block 632-642 -> 622-637 MB, MobileNetV3-Large 840-847 -> 842-845 MB; step times, the two
alternating in one process for 10 rounds, within noise (median ratios 0.995-1.031 on
ResNet-18, MobileNetV3-Large and the Transformer block).

Not covered, as without AMP (MXNet's own bug): a chain of ops that keep nothing between the
producer and the zero gradient with no cast in it, e.g. ``dense(x).reshape(-1) > 0``.
"""
import mxnet as mx

# Captured before any patching, like mxamp's casts (mxamp.runtime.casting).
_ND_SHAPE_ARRAY = mx.nd.shape_array


def keep_for_backward(arr):
    """Make autograd keep ``arr`` (a legacy NDArray it records: :func:`mxamp.runtime.casting.cast`
    hands over the one it casts) until backward: record a tiny op
    whose gradient refers to its input (``shape_array``), and drop its result. That node is
    never in a backward graph; what it leaves is ``arr`` saved in its producer's record, where
    the ``zeros_like`` of a cast's backward finds it.

    >>> x = mx.nd.ones((2, 3)); x.attach_grad()
    >>> with mx.autograd.record():
    ...     keep_for_backward(x * 2)
    """
    if arr.stype == "default":
        _ND_SHAPE_ARRAY(arr)
