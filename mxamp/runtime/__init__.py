"""Rank 3, the runtime: every process-wide change mxamp makes to MXNet, and its state.

One registry (:mod:`mxamp.runtime.patches`) records every attribute mxamp replaces in MXNet
(operator functions, ``NDArray.astype``, autograd's recording scopes, the hybridized-block
hook); ``amp.reset()`` undoes them all. :mod:`mxamp.runtime.state` holds what mxamp remembers
between calls; :mod:`mxamp.runtime.casting` is the one cast and its caches.
"""
