"""Packaging for mxamp: automatic mixed precision for Apache MXNet 1.x and Gluon."""
import os
import re

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def _version():
    with open(os.path.join(HERE, "mxamp", "_version.py")) as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


GLUONCV_PINS = [
    "gluoncv==0.10.5.post0",
    "scipy<1.12",
    "pandas<2.1",
    "matplotlib<3.8",
    "opencv-python<4.9",
]

setup(
    name="mxamp",
    version=_version(),
    description="Automatic mixed precision (float16 / bfloat16) for Apache MXNet 1.x and Gluon",
    long_description=open(os.path.join(HERE, "README.md")).read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["mxamp", "mxamp.*"]),
    python_requires=">=3.7",
    install_requires=["numpy>=1.16,<1.24"],
    extras_require={
        "cpu": ["mxnet==1.9.1"],
        "cu112": ["mxnet-cu112==1.9.1"],
        "gluoncv": GLUONCV_PINS,
        # The tests also run the GluonCV example, so they pull the GluonCV pins, and GluonNLP
        # 0.10's attention cell, which reads the reference's _amp_initialized (builds in ~10 s).
        "test": ["pytest>=7", "mlxtend==0.23.1", "tqdm", "gluonnlp==0.10.0"] + GLUONCV_PINS,
        "example": ["mlxtend==0.23.1", "tqdm", "matplotlib<3.8"],
    },
    entry_points={"console_scripts": ["mxamp-launch=mxamp.launch:main",
                                      "mxamp-compare=mxamp.compare:main",
                                      "mxamp-run=mxamp.__main__:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "License :: OSI Approved :: Apache Software License",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
