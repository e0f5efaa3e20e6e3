"""The hooks behind :mod:`mxamp.runtime.addto`: where MXNet adds gradients is learned while
graphs are built (control-flow bodies, ``grad_req`` changes) and while arrays are marked.

:func:`hook_addto_sources` is installed by ``amp.init`` and undone by ``amp.reset``;
:func:`hook_grad_marks` by ``import mxamp``, for good (it only takes notes).

>>> hook_grad_marks()
>>> import mxnet as mx
>>> from mxamp.runtime import addto
>>> w = mx.nd.ones((2,)); w.attach_grad(grad_req='add')
>>> w.handle.value in addto._ADDED
True
"""
import mxnet as mx
from mxnet.gluon import Parameter

from mxamp.runtime.addto import building_control_flow, note_marked
from mxamp.runtime.patches import is_replaced, replace
from mxamp.runtime.state import STATE


def hook_addto_sources():
    """Know where MXNet adds gradients while graphs are built (:mod:`mxamp.runtime.addto`):
    control-flow bodies are marked while built, and a parameter's ``grad_req`` turning to or
    from ``'add'`` makes every hybridized block rebuild its graph (a new generation)."""
    for name in ("foreach", "while_loop", "cond"):
        if not is_replaced(mx.sym.contrib, name):
            replace(mx.sym.contrib, name, _marking_control_flow(getattr(mx.sym.contrib, name)),
                    kind="block hook")
    if is_replaced(Parameter, "grad_req"):
        return
    req = vars(Parameter)["grad_req"]

    def set_grad_req(param, value):
        was_added = param.grad_req == "add"
        req.fset(param, value)
        if was_added != (param.grad_req == "add"):
            with STATE.lock:
                STATE.generation += 1

    replace(Parameter, "grad_req", property(req.fget, set_grad_req, req.fdel, req.__doc__),
            kind="block hook")


def hook_grad_marks():
    """Tell :mod:`mxamp.runtime.addto` which arrays are marked ``grad_req='add'``: wraps
    ``mx.autograd.mark_variables`` (Gluon parameters) and both ``attach_grad`` methods.
    Installed by ``import mxamp`` and never undone: it only takes notes."""
    if getattr(mx.autograd.mark_variables, "_mxamp_notes_marks", False):
        return

    def mark_variables(variables, gradients, grad_reqs="write"):
        mark(variables, gradients, grad_reqs)
        note_marked(variables, grad_reqs)

    mark = mx.autograd.mark_variables
    mark_variables._mxamp_notes_marks = True
    mark_variables.__name__, mark_variables.__doc__ = mark.__name__, mark.__doc__
    mx.autograd.mark_variables = mark_variables
    for array_class in (mx.nd.NDArray, mx.np.ndarray):
        attach = vars(array_class)["attach_grad"]

        def attach_grad(array, grad_req="write", *args, _attach=attach, **kwargs):
            _attach(array, grad_req, *args, **kwargs)
            note_marked(array, grad_req)

        attach_grad.__name__, attach_grad.__doc__ = attach.__name__, attach.__doc__
        setattr(array_class, "attach_grad", attach_grad)


def _marking_control_flow(build):
    def marked(*args, **kwargs):
        with building_control_flow():
            return build(*args, **kwargs)
    marked.__name__, marked.__doc__ = build.__name__, build.__doc__
    return marked
