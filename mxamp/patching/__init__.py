"""Rank 5, patching: ``amp.init`` (O1) wraps MXNet's operator functions with the plan's rules.

:mod:`~mxamp.patching.patcher` applies and undoes the patch; :mod:`~mxamp.patching.wrappers`
holds one wrapper per op category; :mod:`~mxamp.patching.loss_outputs` makes SoftmaxOutput and
its kin follow the live loss scale.
"""
