"""mxamp's version: one line, read by ``setup.py``, ``mxamp.__version__`` and the doctor."""
__version__ = "0.1.0"
