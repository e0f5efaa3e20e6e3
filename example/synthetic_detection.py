"""A small generated VOC-style detection dataset, so detection examples run without downloads.

Each image is a noisy background with one to three filled rectangles; a rectangle's colour
decides its class. Items have the layout of ``gluoncv.data.VOCDetection``: an HWC uint8
``mx.nd.NDArray`` image and a float32 ``numpy`` label of shape (boxes, 6) holding
``xmin, ymin, xmax, ymax, class_id, difficult`` in pixels.

>>> from synthetic_detection import SyntheticVOC
>>> image, label = SyntheticVOC(num_images=2, size=96)[0]
>>> image.shape, label.shape[1]
((96, 96, 3), 6)
"""
import numpy as np
from mxnet import gluon, nd

#: VOC's class names, so a model built for VOC (20 classes) trains on this data unchanged.
VOC_CLASSES = ("aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair",
               "cow", "diningtable", "dog", "horse", "motorbike", "person", "pottedplant",
               "sheep", "sofa", "train", "tvmonitor")
#: The classes that appear in the images, and the colour each is drawn in.
CLASS_COLORS = {0: (220, 40, 40), 6: (40, 200, 60), 14: (50, 80, 230)}


class SyntheticVOC(gluon.data.Dataset):
    """``num_images`` generated square images of ``size`` pixels; the same ``seed``, the same data.

    >>> len(SyntheticVOC(num_images=5))
    5
    """

    CLASSES = VOC_CLASSES

    def __init__(self, num_images=32, size=160, seed=0):
        if num_images < 1 or size < 32:
            raise ValueError(f"need num_images >= 1 and size >= 32, got {num_images}, {size}")
        rng = np.random.RandomState(seed)
        self._items = [self._make(rng, size) for _ in range(num_images)]

    @property
    def classes(self):
        return self.CLASSES

    @staticmethod
    def _make(rng, size):
        image = rng.randint(0, 60, size=(size, size, 3)).astype(np.uint8)
        boxes = []
        for _ in range(rng.randint(1, 4)):
            w, h = rng.randint(size // 6, size // 2, size=2)
            x0, y0 = rng.randint(0, size - w), rng.randint(0, size - h)
            class_id = int(rng.choice(list(CLASS_COLORS)))
            image[y0:y0 + h, x0:x0 + w] = CLASS_COLORS[class_id]
            boxes.append([x0, y0, x0 + w - 1, y0 + h - 1, class_id, 0])
        return image, np.array(boxes, dtype=np.float32)

    def __len__(self):
        return len(self._items)

    def __getitem__(self, idx):
        image, label = self._items[idx]
        return nd.array(image, dtype="uint8"), label.copy()
