"""Rank 2, the backend: what the loaded libmxnet and this machine offer, as facts.

MXNet's private API (the one module that touches it), the operator registry and the functions
MXNet generated, the CPU's bfloat16 class, AMX, the machine probe, which devices this process
has, environment variables, and the one timing helper. Nothing here knows about op lists, plans
or patches; everything above may read it.
"""
