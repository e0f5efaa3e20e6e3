"""Rank 4, precision: the one place that decides which precision each op computes in.

A request (a target dtype, overrides, a tuned :class:`~mxamp.precision.policy.Policy`) is
resolved into op lists (:mod:`~mxamp.precision.resolve`), into a device plan per device
(:mod:`~mxamp.precision.device_plan`), and into one :class:`~mxamp.precision.plan.Plan`. The
patcher, the converter and the trainer hook read the plan; nothing else decides.
"""
