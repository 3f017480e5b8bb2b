"""Fill-mask tokenisation and decoding with the real BERT uncased tokenizer."""

from __future__ import annotations

import numpy as np
import pytest

from contract.errors import InvalidInput, RequestError
from contract.spec import SpecError
from contract.text import FillMaskCodec
from support.helpers import BERT_TOKENIZER

pytestmark = pytest.mark.timeout(60)

CONFIG = {"n": 16, "max_predictions": 2, "pad_token_id": 0, "mask_token_id": 103, "vocab_size": 30522}


@pytest.fixture(scope="module")
def codec() -> FillMaskCodec:
    return FillMaskCodec(BERT_TOKENIZER, CONFIG, model_name="m")


def test_encode_keeps_the_text_length_and_finds_masks(codec: FillMaskCodec) -> None:
    enc = codec.encode("Paris is the [MASK] of France.")
    assert enc.ids[0] == 101 and enc.ids[-1] == 102  # [CLS] ... [SEP]
    assert enc.mask_positions == [4]
    ids, positions = enc.feeds["input_ids"], enc.feeds["mask_positions"]
    assert ids.dtype == np.int64 and positions.dtype == np.int64
    assert list(ids) == enc.ids and list(positions) == [4]


def test_collate_pads_a_batch_to_its_longest_text(codec: FillMaskCodec) -> None:
    short, long = codec.encode("[MASK] ."), codec.encode("one two three four five six [MASK] [MASK] .")
    assert (len(short.ids), len(long.ids)) == (4, 11)
    batch = codec.collate([short.feeds, long.feeds])
    # 11 tokens round up to 16 (the multiple of 8), which is also n here; two masks -> two slots
    assert batch["input_ids"].shape == (2, 16) and batch["mask_positions"].shape == (2, 2)
    assert list(batch["input_ids"][0]) == short.ids + [0] * 12
    assert list(batch["input_ids"][1]) == long.ids + [0] * 5
    assert batch["mask_positions"].tolist() == [[1, 0], long.mask_positions]
    alone = codec.collate([short.feeds])
    assert alone["input_ids"].shape == (1, 8) and alone["mask_positions"].shape == (1, 1)
    fixed = codec.collate([short.feeds], fixed=True)  # the full window and every slot
    assert fixed["input_ids"].shape == (1, 16) and fixed["mask_positions"].tolist() == [[1, 0]]
    assert [codec.padded_length(n) for n in (1, 8, 9, 16)] == [8, 8, 16, 16]


def test_limits_are_reported_in_tokens(codec: FillMaskCodec) -> None:
    with pytest.raises(RequestError) as info:
        codec.encode("word " * 20 + "[MASK]")
    assert isinstance(info.value, InvalidInput) and info.value.code == "text_too_long"
    assert "23 tokens" in info.value.message and "at most 16 tokens" in info.value.message
    with pytest.raises(RequestError) as info:
        codec.encode("no mask here")
    assert info.value.code == "no_mask"
    with pytest.raises(RequestError) as info:
        codec.encode("[MASK] [MASK] [MASK]")
    assert info.value.code == "too_many_masks" and "at most 2" in info.value.message


def test_decode_is_a_softmax_ranking_per_mask(codec: FillMaskCodec) -> None:
    enc = codec.encode("the [MASK] sat on the [MASK].")
    logits = np.zeros((2, 30522), np.float32)
    cat, dog, mat = (codec.tokenizer.token_to_id(w) for w in ("cat", "dog", "mat"))
    logits[0, cat], logits[0, dog] = 10.0, 9.0
    logits[1, mat] = 12.0
    first, second = codec.decode(enc, logits, top_k=2)
    assert [p["token"] for p in first] == [cat, dog]
    assert first[0]["token_str"] == "cat"
    assert first[0]["sequence"] == "the cat sat on the [MASK]."  # the other mask stays visible
    assert second[0]["sequence"] == "the [MASK] sat on the mat."
    assert first[0]["score"] > first[1]["score"] > 0
    row = logits[0].astype(np.float64)
    expected = np.exp(row[cat] - row.max()) / np.exp(row - row.max()).sum()
    assert first[0]["score"] == pytest.approx(expected, rel=1e-6)  # float32 logits


def test_token_strings_stay_those_of_a_fresh_decode() -> None:
    """Token strings are decoded once per id and then reused: word pieces, punctuation and
    special tokens keep what the tokenizer's own decode of that id gives, request after request."""
    codec = FillMaskCodec(BERT_TOKENIZER, CONFIG, model_name="m")
    enc = codec.encode("a [MASK] day")
    rng = np.random.default_rng(0)
    seen: dict[int, str] = {}
    for _ in range(3):  # later rounds predict ids already decoded
        logits = rng.normal(0, 1, (1, 30522)).astype(np.float32)
        picks = [codec.tokenizer.token_to_id(w) for w in ("##ing", ",", "[SEP]", "day")]
        logits[0, picks] = 20.0
        for p in codec.decode(enc, logits, top_k=6)[0]:
            assert p["token_str"] == codec.tokenizer.decode([p["token"]], skip_special_tokens=False)
            assert seen.setdefault(p["token"], p["token_str"]) == p["token_str"]
    assert {codec.tokenizer.token_to_id(w) for w in ("##ing", ",", "[SEP]", "day")} <= seen.keys()
    assert seen[codec.tokenizer.token_to_id("##ing")] == "##ing"


def test_targets_restrict_candidates_and_use_the_first_wordpiece(codec: FillMaskCodec) -> None:
    enc = codec.encode("a [MASK] day")
    logits = np.zeros((2, 30522), np.float32)
    sunny = codec.tokenizer.token_to_id("sunny")
    logits[0, sunny] = 5.0
    # "Sunny" is not a vocabulary entry (uncased vocab): its first wordpiece "sunny" is used.
    targets = codec.target_ids(["Sunny", "rainy", "rainy"])
    assert targets[0] == sunny and len(targets) == 2  # duplicates collapse
    (preds,) = codec.decode(enc, logits, top_k=5, target_ids=targets)
    assert [p["token"] for p in preds] == targets  # top_k clipped to the number of targets
    # Scores stay probabilities over the whole vocabulary (as in HF), not renormalised.
    assert preds[0]["score"] < 0.01
    multi = codec.target_ids(["unbelievability"])
    assert multi == [codec.tokenizer.encode("unbelievability", add_special_tokens=False).ids[0]]
    with pytest.raises(RequestError):
        codec.target_ids([" "])


def test_tokenizer_padding_and_truncation_settings_are_ignored(codec: FillMaskCodec) -> None:
    # The shipped tokenizer.json pads/truncates to 128; the codec must see the real length.
    assert len(codec.encode("[MASK]").ids) == 3


def test_a_tokenizer_past_the_model_vocabulary_is_refused_with_both_sizes() -> None:
    with pytest.raises(SpecError) as refused:
        FillMaskCodec(BERT_TOKENIZER, {**CONFIG, "vocab_size": 30000}, model_name="m")
    message = str(refused.value)
    assert str(BERT_TOKENIZER) in message and "30522 ids" in message and "vocabulary of 30000" in message
    # A model with spare rows (a padded vocabulary) serves the tokenizer's ids as they are.
    assert FillMaskCodec(BERT_TOKENIZER, {**CONFIG, "vocab_size": 30528}).vocab_size == 30528
