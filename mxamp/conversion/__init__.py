"""Rank 5, conversion: trained models into low-precision inference models, and O2.

:mod:`~mxamp.conversion.convert` runs MXNet's graph pass over Symbols, Modules and
HybridBlocks; :mod:`~mxamp.conversion.o2` casts a Gluon model's layers (``cast_model``);
:mod:`~mxamp.conversion.graph` traces blocks; :mod:`~mxamp.conversion.precision_pass` drives
MXNet's ``ReducePrecision`` pass.
"""
