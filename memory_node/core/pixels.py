"""Images as numpy arrays, coerced to the one layout the models and the captioner take.

Its own module (numpy only, no cv2) so that the embedders and the LLM client both use it
without importing each other.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def as_bgr_uint8(image: Any) -> np.ndarray:
    """Coerce an image to contiguous uint8 HxWx3 BGR, or raise ValueError saying why.

    Accepts grey (HxW or HxWx1), BGR and BGRA; uint8 as is, float in 0..1 (or 0..255 when
    any value exceeds 1), uint16 scaled down, bool as black/white. Camera drivers hand over all
    of these, and a describer should not fail on a mono camera.
    """
    if not isinstance(image, np.ndarray):
        raise ValueError(f"image must be a numpy array, got {type(image).__name__}")
    if image.size == 0:
        raise ValueError(f"image is empty (shape {image.shape})")
    if image.ndim == 3 and image.shape[2] == 1:
        image = image[:, :, 0]
    if image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] not in (3, 4)):
        raise ValueError(
            f"image must be HxW (grey), HxWx3 (BGR) or HxWx4 (BGRA), got shape {image.shape}"
        )
    image = _to_uint8(image)
    if image.ndim == 2:
        image = np.repeat(image[:, :, None], 3, axis=2)
    elif image.shape[2] == 4:
        image = image[:, :, :3]
    return np.ascontiguousarray(image)


def _to_uint8(image: np.ndarray) -> np.ndarray:
    if image.dtype == np.uint8:
        return image
    if image.dtype == np.bool_:
        return image.astype(np.uint8) * 255
    if image.dtype == np.uint16:
        return (image // 257).astype(np.uint8)
    if np.issubdtype(image.dtype, np.floating):
        data = np.nan_to_num(image.astype(np.float32), nan=0.0, posinf=255.0, neginf=0.0)
        if float(data.max(initial=0.0)) <= 1.0:
            data = data * 255.0
        return np.clip(np.rint(data), 0, 255).astype(np.uint8)
    if np.issubdtype(image.dtype, np.integer):
        return np.clip(image, 0, 255).astype(np.uint8)
    raise ValueError(f"unsupported image dtype {image.dtype}")
