"""Text and image embedders and image describers, chosen by name.

Importing this package loads neither onnxruntime nor OpenCV; each model loads on first use.
"""

from memory_node.core.embedders.base import (
    ONNX_THREADS_ENV,
    ImageDescriber,
    ImageDescription,
    ImageEmbedder,
    ModelUnavailable,
    TextEmbedder,
    l2_normalize,
    resolve_onnx_threads,
)
from memory_node.core.embedders.registry import (
    describer_names,
    get_describer,
    get_image_embedder,
    get_text_embedder,
    image_embedder_names,
    register_describer,
    register_image_embedder,
    register_text_embedder,
    text_embedder_names,
)
from memory_node.core.pixels import as_bgr_uint8

__all__ = [
    "ONNX_THREADS_ENV",
    "ImageDescriber",
    "ImageDescription",
    "ImageEmbedder",
    "ModelUnavailable",
    "TextEmbedder",
    "as_bgr_uint8",
    "describer_names",
    "get_describer",
    "get_image_embedder",
    "get_text_embedder",
    "image_embedder_names",
    "l2_normalize",
    "register_describer",
    "register_image_embedder",
    "register_text_embedder",
    "resolve_onnx_threads",
    "text_embedder_names",
]
