"""Name -> factory tables for text embedders, image embedders and image describers.

Factories import their module only when called, so naming a model in the config costs nothing
until it is built, and building it loads no weights until its first use.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from memory_node.core.embedders.base import ImageDescriber, ImageEmbedder, TextEmbedder

TextEmbedderFactory = Callable[..., TextEmbedder]
ImageEmbedderFactory = Callable[..., ImageEmbedder]
DescriberFactory = Callable[..., ImageDescriber]


def _minilm(**options: Any) -> TextEmbedder:
    from memory_node.core.embedders.minilm import MiniLMEmbedder

    return MiniLMEmbedder(**options)


def _clip(**options: Any) -> Any:
    from memory_node.core.embedders.clip import ClipEmbedder

    return ClipEmbedder(**options)


def _opencv(**options: Any) -> ImageDescriber:
    from memory_node.core.embedders.describer import OpenCVDescriber

    return OpenCVDescriber(**options)


def _vlm(**options: Any) -> ImageDescriber:
    from memory_node.core.embedders.describer import VLMDescriber

    return VLMDescriber(**options)


class _Table:
    def __init__(self, kind: str, entries: dict[str, Callable[..., Any]]) -> None:
        self.kind = kind
        self._entries = dict(entries)
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._entries)

    def register(self, name: str, factory: Callable[..., Any], replace: bool) -> None:
        key = _key(name)
        if not key:
            raise ValueError(f"{self.kind} name must not be empty")
        if not callable(factory):
            raise TypeError(f"{self.kind} factory for {key!r} is not callable")
        with self._lock:
            if key in self._entries and not replace:
                raise ValueError(f"{self.kind} {key!r} is already registered (replace=True)")
            self._entries[key] = factory

    def build(self, name: str, options: dict[str, Any]) -> Any:
        key = _key(name)
        with self._lock:
            factory = self._entries.get(key)
            known = ", ".join(sorted(self._entries))
        if factory is None:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {known}")
        return factory(**options)


def _key(name: str) -> str:
    return str(name).strip().lower()


_TEXT = _Table("text embedder", {"minilm": _minilm, "clip": _clip})
_IMAGE = _Table("image embedder", {"clip": _clip})
_DESCRIBERS = _Table("image describer", {"opencv": _opencv, "vlm": _vlm})


def get_text_embedder(name: str = "minilm", **options: Any) -> TextEmbedder:
    """A text embedder by name ("minilm" default, "clip"); options go to its constructor."""
    return _TEXT.build(name, options)


def get_image_embedder(name: str = "clip", **options: Any) -> ImageEmbedder:
    """An image embedder by name ("clip": ONNX towers at configured paths)."""
    return _IMAGE.build(name, options)


def get_describer(name: str = "opencv", **options: Any) -> ImageDescriber:
    """An image describer by name ("opencv" heuristic default, "vlm" via the chat endpoint)."""
    return _DESCRIBERS.build(name, options)


def register_text_embedder(
    name: str, factory: TextEmbedderFactory, *, replace: bool = False
) -> None:
    _TEXT.register(name, factory, replace)


def register_image_embedder(
    name: str, factory: ImageEmbedderFactory, *, replace: bool = False
) -> None:
    _IMAGE.register(name, factory, replace)


def register_describer(name: str, factory: DescriberFactory, *, replace: bool = False) -> None:
    _DESCRIBERS.register(name, factory, replace)


def text_embedder_names() -> list[str]:
    return _TEXT.names()


def image_embedder_names() -> list[str]:
    return _IMAGE.names()


def describer_names() -> list[str]:
    return _DESCRIBERS.names()
