"""Tiny CLIP-shaped ONNX towers and a tokenizer, built by the tests: the input/output names
and shapes of the pinned pre-exported model (pixel_values -> image_embeds, input_ids +
attention_mask -> text_embeds), weights meaningless. No CLIP weights exist offline."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DIM = 8
VOCAB = ["[PAD]", "[UNK]", "a", "red", "door", "blue", "bowl", "of", "soup", "backpack"]


def _bytes(graph: onnx.GraphProto) -> bytes:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    buf = io.BytesIO()
    onnx.save(model, buf)
    return buf.getvalue()


def image_tower(pad_bytes: int = 0) -> bytes:
    """pixel_values [N,3,224,224] -> mean colour -> 3x8 projection -> image_embeds [N,8].

    `pad_bytes` adds an unused initializer, for a file of representative size."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.normal(size=(3, DIM)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.normal(size=(DIM,)).astype(np.float32), "B")]
    if pad_bytes:
        inits.append(numpy_helper.from_array(np.zeros(pad_bytes // 4, np.float32), "pad"))
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["pixel_values"], ["pooled"]),
         helper.make_node("Flatten", ["pooled"], ["flat"]),
         helper.make_node("MatMul", ["flat", "W"], ["proj"]),
         helper.make_node("Add", ["proj", "B"], ["image_embeds"])],
        "image_tower",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("image_embeds", TensorProto.FLOAT, ["N", DIM])],
        initializer=inits)
    return _bytes(graph)


def text_tower() -> bytes:
    """input_ids, attention_mask [N,L] -> masked mean of a token table -> text_embeds [N,8]."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.normal(size=(len(VOCAB), DIM)).astype(np.float32),
                                     "E"),
             numpy_helper.from_array(np.array([1], dtype=np.int64), "axes"),
             numpy_helper.from_array(np.array([2], dtype=np.int64), "axes2")]
    nodes = [helper.make_node("Gather", ["E", "input_ids"], ["tokens"]),
             helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["m", "axes2"], ["m3"]),
             helper.make_node("Mul", ["tokens", "m3"], ["masked"]),
             helper.make_node("ReduceSum", ["masked", "axes"], ["num"], keepdims=0),
             helper.make_node("ReduceSum", ["m3", "axes"], ["den"], keepdims=0),
             helper.make_node("Div", ["num", "den"], ["text_embeds"])]
    graph = helper.make_graph(
        nodes, "text_tower",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["N", "L"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["N", "L"])],
        [helper.make_tensor_value_info("text_embeds", TensorProto.FLOAT, ["N", DIM])],
        initializer=inits)
    return _bytes(graph)


def tokenizer_json() -> bytes:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    return tok.to_str().encode()


def clip_repo_files() -> dict[str, bytes]:
    """The pinned CLIP spec's files, by repository path, as tiny stand-ins."""
    from memory_node.core.model_store import CLIP

    made = {"image_model": image_tower(), "text_model": text_tower(),
            "tokenizer": tokenizer_json()}
    return {CLIP.files[role]: data for role, data in made.items()}


def write_files(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
