"""Rank 5, training: dynamic loss scaling and multi-precision updates for Gluon Trainers.

:mod:`~mxamp.training.scaler` is the pure loss-scale state machine;
:mod:`~mxamp.training.trainer` attaches it (``init_trainer``, ``scale_loss``, ``unscale``);
:mod:`~mxamp.training.trainer_scaler` is the object ``Trainer._update`` asks;
:mod:`~mxamp.training.overflow` checks gradients; :mod:`~mxamp.training.optimizers` keeps
float32 master weights; :mod:`~mxamp.training.distributed` makes workers agree.
"""
