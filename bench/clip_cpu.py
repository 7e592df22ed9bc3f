"""CPU cost of the CLIP path per camera frame, on a representative-size generated model.

No CLIP weights can be downloaded here, so this builds an image tower with the architecture
and size of ViT-B/32 (patch 32, width 768, 12 layers, 12 heads, MLP 3072, QuickGELU,
projection 512; random weights), quantises it to int8 the way the pinned pre-exported file
is (onnxruntime dynamic quantisation), and times `ClipEmbedder.embed_images` on 640x480
frames (preprocessing included) with 1 and 2 ONNX Runtime threads. The same for the text
tower (width 512, 12 layers, 8 heads, 77 tokens) per query. The arithmetic is the real
model's; only the weights differ, and they do not change the cost.

    python -m bench.clip_cpu [--out bench/results/clip_cpu.json] [--frames 20]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np


def _vit_image_tower(path: Path, width: int = 768, layers: int = 12, heads: int = 12,
                     patch: int = 32, size: int = 224, out_dim: int = 512) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits: list = []
    nodes: list = []

    def w(name: str, *shape: int, scale: float = 0.02) -> str:
        inits.append(numpy_helper.from_array(
            (rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def c(name: str, arr: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(arr, name))
        return name

    def n(op: str, ins: list[str], out: str, **kw) -> str:
        nodes.append(helper.make_node(op, ins, [out], **kw))
        return out

    tokens = (size // patch) ** 2 + 1
    x = n("Conv", ["pixel_values", w("conv_w", width, 3, patch, patch)], "patches",
          strides=[patch, patch])
    x = n("Reshape", [x, c("s_flat", np.array([0, width, -1], np.int64))], "flat")
    x = n("Transpose", [x], "seq", perm=[0, 2, 1])
    batch = n("Gather", [n("Shape", ["pixel_values"], "shp"), c("i0", np.array([0], np.int64))],
              "batch", axis=0)
    cls_shape = n("Concat", [batch, c("one_w", np.array([1, width], np.int64))], "cls_shape",
                  axis=0)
    cls = n("Expand", [w("cls", 1, 1, width), cls_shape], "cls_b")
    x = n("Concat", [cls, x], "with_cls", axis=1)
    x = n("Add", [x, w("pos", 1, tokens, width)], "pos_x")

    def ln(x: str, name: str) -> str:
        return n("LayerNormalization", [x, c(f"{name}_g", np.ones(width, np.float32)),
                                        c(f"{name}_b", np.zeros(width, np.float32))],
                 f"{name}_out", axis=-1)

    x = ln(x, "ln_pre")
    hd = width // heads
    for i in range(layers):
        p = f"l{i}"
        h = ln(x, f"{p}_ln1")
        qkv = n("Add", [n("MatMul", [h, w(f"{p}_wqkv", width, 3 * width)], f"{p}_qkv0"),
                        w(f"{p}_bqkv", 3 * width)], f"{p}_qkv")
        qkv = n("Reshape", [qkv, c(f"{p}_s5", np.array([0, 0, 3, heads, hd], np.int64))],
                f"{p}_qkv5")
        qkv = n("Transpose", [qkv], f"{p}_qkvT", perm=[2, 0, 3, 1, 4])
        nodes.append(helper.make_node("Split", [qkv], [f"{p}_q1", f"{p}_k1", f"{p}_v1"],
                                      axis=0, num_outputs=3))
        ax0 = c(f"{p}_ax0", np.array([0], np.int64))
        q = n("Squeeze", [f"{p}_q1", ax0], f"{p}_q")
        k = n("Squeeze", [f"{p}_k1", ax0], f"{p}_k")
        v = n("Squeeze", [f"{p}_v1", ax0], f"{p}_v")
        s = n("MatMul", [q, n("Transpose", [k], f"{p}_kT", perm=[0, 1, 3, 2])], f"{p}_s0")
        s = n("Mul", [s, c(f"{p}_scale", np.array(hd ** -0.5, np.float32))], f"{p}_s1")
        a = n("MatMul", [n("Softmax", [s], f"{p}_sm", axis=-1), v], f"{p}_a0")
        a = n("Transpose", [a], f"{p}_aT", perm=[0, 2, 1, 3])
        a = n("Reshape", [a, c(f"{p}_s3", np.array([0, 0, width], np.int64))], f"{p}_a3")
        a = n("Add", [n("MatMul", [a, w(f"{p}_wo", width, width)], f"{p}_o0"),
                      w(f"{p}_bo", width)], f"{p}_o")
        x = n("Add", [x, a], f"{p}_r1")
        h = ln(x, f"{p}_ln2")
        h = n("Add", [n("MatMul", [h, w(f"{p}_w1", width, 4 * width)], f"{p}_m0"),
                      w(f"{p}_b1", 4 * width)], f"{p}_m1")
        g = n("Sigmoid", [n("Mul", [h, c(f"{p}_1702", np.array(1.702, np.float32))],
                            f"{p}_hs")], f"{p}_sig")
        h = n("Mul", [h, g], f"{p}_gelu")  # QuickGELU, as in OpenAI CLIP
        h = n("Add", [n("MatMul", [h, w(f"{p}_w2", 4 * width, width)], f"{p}_m2"),
                      w(f"{p}_b2", width)], f"{p}_m3")
        x = n("Add", [x, h], f"{p}_r2")
    first = n("Gather", [x, c("tok0", np.array(0, np.int64))], "cls_out", axis=1)
    first = ln(first, "ln_post")
    n("MatMul", [first, w("proj", width, out_dim)], "image_embeds")
    graph = helper.make_graph(
        nodes, "vit_b_32_image",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT,
                                       ["N", 3, size, size])],
        [helper.make_tensor_value_info("image_embeds", TensorProto.FLOAT, ["N", out_dim])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save(model, str(path))


def _quantize(src: Path, dst: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QUInt8)


def _time_images(model: Path, threads: int, frames: list[np.ndarray]) -> float:
    from memory_node.core.embedders.clip import ClipEmbedder

    emb = ClipEmbedder(image_model_path=model, onnx_threads=threads)
    emb.embed_images(frames[:2])  # load and warm up
    t0 = time.process_time()
    w0 = time.perf_counter()
    for f in frames:
        emb.embed_images([f])
    wall = (time.perf_counter() - w0) / len(frames)
    cpu = (time.process_time() - t0) / len(frames)
    return round(wall * 1000, 1), round(cpu * 1000, 1)


def _time_heuristic(frames: list[np.ndarray]) -> tuple[float, float]:
    """The default path per frame: the OpenCV describer and a MiniLM embedding of its text."""
    from memory_node.core.embedders.describer import OpenCVDescriber
    from memory_node.core.embedders.minilm import MiniLMEmbedder

    describer, text = OpenCVDescriber(), MiniLMEmbedder(onnx_threads=1)
    text.embed_texts([describer.describe(frames[0]).text])
    t0, w0 = time.process_time(), time.perf_counter()
    for f in frames:
        text.embed_texts([describer.describe(f).text])
    n = len(frames)
    return (round((time.perf_counter() - w0) / n * 1000, 1),
            round((time.process_time() - t0) / n * 1000, 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.clip_cpu", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("bench/results/clip_cpu.json"))
    parser.add_argument("--frames", type=int, default=20)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(1)
    frames = [rng.integers(0, 255, (480, 640, 3), dtype=np.uint8) for _ in range(args.frames)]
    result: dict = {"model": "generated ViT-B/32 image tower (random weights), int8 dynamic "
                             "quantisation like the pinned file", "frame": "640x480 BGR",
                    "cpus": os.cpu_count(), "load_1min": os.getloadavg()[0]}
    wall, cpu = _time_heuristic(frames)
    result["heuristic_describer_minilm"] = {"wall_ms_per_frame": wall, "cpu_ms_per_frame": cpu}
    print("heuristic describer + MiniLM:", wall, "ms wall,", cpu, "ms CPU per frame", flush=True)
    with tempfile.TemporaryDirectory() as d:
        fp32, q8 = Path(d) / "vit_fp32.onnx", Path(d) / "vit_q8.onnx"
        t0 = time.perf_counter()
        _vit_image_tower(fp32)
        _quantize(fp32, q8)
        result["build_s"] = round(time.perf_counter() - t0, 1)
        result["file_mb"] = {"fp32": round(fp32.stat().st_size / 1e6, 1),
                             "int8": round(q8.stat().st_size / 1e6, 1)}
        for name, path in (("int8", q8), ("fp32", fp32)):
            for threads in (1, 2):
                wall, cpu = _time_images(path, threads, frames)
                result[f"{name}_threads{threads}"] = {"wall_ms_per_frame": wall,
                                                      "cpu_ms_per_frame": cpu}
                print(name, threads, "threads:", wall, "ms wall,", cpu, "ms CPU per frame",
                      flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
