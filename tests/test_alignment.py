"""Span alignment of two tokenizations of one text, on hand-made byte vocabularies."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaForCausalLM

from swarmnode.learn.alignment import (
    MAX_PENDING,
    SpanBatch,
    Tokenization,
    align,
    sender_text,
    spans_of,
    token_ends,
    translate,
)
from swarmnode.learn.loss import sequence_divergence
from swarmnode.model.families import family_of
from swarmnode.model.tiny import TINY_LLAMA_SPEC, TINY_SPEC, build_model, build_tokenizer

_TINY, _LLAMA = build_tokenizer(TINY_SPEC), build_tokenizer(TINY_LLAMA_SPEC)


class ByteVocab:
    """A tokenizer by greedy longest match over a list of byte strings (every single byte is in
    it, so any text encodes); decoding joins the bytes, replacing what is not yet a character."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = sorted(set(pieces) | {bytes([b]) for b in range(256)}, key=lambda p: (-len(p), p))
        self.ids = {piece: k for k, piece in enumerate(self.pieces)}

    def encode(self, text: str) -> list[int]:
        data, ids = text.encode(), []
        while data:
            piece = next(p for p in self.pieces if data.startswith(p))
            ids.append(self.ids[piece])
            data = data[len(piece):]
        return ids

    def decode(self, ids) -> str:
        return b"".join(self.pieces[k] for k in ids).decode("utf-8", errors="replace")


def _aligned(sender: ByteVocab, ours: ByteVocab, text: str):
    sent = sender_text(sender.encode(text), sender.decode)
    our_ids = ours.encode(sent.text)
    our_text, our_ends = token_ends(our_ids, ours.decode)
    assert our_text == sent.text
    return align(sent.ends, our_ends, len(sent.text)), sent, our_ids


def test_identical_tokenizations_align_token_by_token():
    vocab = ByteVocab([b"12", b"+", b"3", b" = ", b"<answer>"])
    alignment, _, our_ids = _aligned(vocab, vocab, "12+3 = 15 <answer>15")
    assert alignment.token_level and alignment.spans == len(our_ids)
    assert list(alignment.our_span) == list(range(len(our_ids))) == list(alignment.sender_span)


def test_a_coarser_tokenizer_s_tokens_each_cover_a_span_of_ours():
    fine, coarse = ByteVocab([]), ByteVocab([b"123", b"45", b" + "])
    alignment, sent, our_ids = _aligned(coarse, fine, "123 + 45")  # sender coarse: 123 | " + " | 45
    assert alignment.spans == 3 and list(alignment.sender_span) == [0, 1, 2]
    assert list(alignment.our_span) == [0, 0, 0, 1, 1, 1, 2, 2]
    assert not alignment.token_level


def test_disjoint_boundaries_leave_one_span_for_the_whole_text():
    left, right = ByteVocab([b"ab", b"cd"]), ByteVocab([b"a", b"bc", b"d"])  # ab|cd against a|bc|d
    alignment, _, _ = _aligned(left, right, "abcd")
    assert alignment.spans == 1 and list(alignment.our_span) == [0, 0, 0] and list(alignment.sender_span) == [0, 0]


def test_byte_fallback_and_an_emoji_leave_no_boundary_inside_a_character():
    """The sender spells the emoji and the euro sign byte by byte; we have each as one token.
    No boundary falls inside either character, so each is one span of four or three bytes."""
    text = "x\U0001F600y€z"
    alignment, sent, our_ids = _aligned(ByteVocab([]), ByteVocab(["\U0001F600".encode(), "€".encode()]), text)
    assert sent.text == text and sent.tokens == len(text.encode())
    assert alignment.spans == 5 and list(alignment.our_span) == [0, 1, 2, 3, 4]
    assert list(alignment.sender_span) == [0, 1, 1, 1, 1, 2, 3, 3, 3, 4]


def test_a_completion_cut_inside_a_character_is_trained_up_to_its_last_whole_one():
    vocab = ByteVocab([])
    ids = vocab.encode("ab€")[:-1]  # the limit stopped it after two of the euro sign's three bytes
    sent = sender_text(ids, vocab.decode)
    assert sent.text == "ab" and sent.tokens == 2 and sent.ends == [1, 2, None, None]
    alignment = align(sent.ends, token_ends(vocab.encode("ab"), vocab.decode)[1], 2)
    assert list(alignment.sender_span) == [0, 1, -1, -1], "the unfinished character's bytes are dropped"


def test_a_text_whose_tokens_do_not_end_at_its_end_is_refused():
    with pytest.raises(ValueError, match="sender"):
        align([1, None], [1, 2], 2)
    with pytest.raises(ValueError, match="our tokens"):
        align([1, 2], [1, None], 2)
    with pytest.raises(ValueError, match="empty"):
        align([], [], 0)


def test_a_span_s_ratio_is_its_log_prob_sums_and_every_token_of_ours_in_it_takes_it():
    fine, coarse = ByteVocab([]), ByteVocab([b"123", b"45", b" + "])
    alignment, _, _ = _aligned(coarse, fine, "123 + 45")
    gen = np.array([-1.0, -0.5, -2.0])  # the sender's log-prob of each of its tokens
    theta = np.array([-0.1, -0.2, -0.3, -0.1, -0.1, -0.1, -1.0, -0.5])
    log_w = spans_of(alignment, gen).log_ratios(theta)
    expected = [-0.6 + 1.0] * 3 + [-0.3 + 0.5] * 3 + [-1.5 + 2.0] * 2
    assert log_w.tolist() == pytest.approx(expected)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-8.0, 0.0), min_size=1, max_size=30), st.lists(st.floats(-8.0, 0.0), min_size=30, max_size=30))
def test_where_both_share_every_boundary_the_weights_are_today_s_token_level_ones(gen_list, theta_list):
    """Same tokenization: per-token log-ratios and the filter's k3 divergence equal the token-level ones."""
    vocab = ByteVocab([b"7", b"42", b"<answer>"])
    ids = (vocab.encode("42+7=49<answer>49") * 4)[: len(gen_list)]  # 36 tokens, at least as many as gen_list
    text, ends = token_ends(ids, vocab.decode)
    alignment = align(ends, ends, len(text))
    assert alignment.token_level
    gen, theta = np.array(gen_list, np.float32), np.array(theta_list[: len(gen_list)], np.float32)
    spans = spans_of(alignment, gen)
    np.testing.assert_allclose(spans.log_ratios(theta), theta.astype(np.float64) - gen, atol=1e-12, rtol=0)
    batch = SpanBatch.of([spans], len(theta))
    by_span = sequence_divergence(batch.sums(torch.from_numpy(theta)[None]), batch.gen, batch.mask, "k3-mean")
    token_level = sequence_divergence(torch.from_numpy(theta)[None], torch.from_numpy(gen)[None], torch.ones(1, len(gen)), "k3-mean")
    assert float(by_span[0]) == pytest.approx(float(token_level[0]), abs=1e-6)


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab1 2€\U0001F600")), min_size=1, max_size=25))
def test_any_text_aligns_and_every_token_of_ours_lies_in_a_span(text):
    sender, ours = ByteVocab([b"ab", b"12", b" 2", "€".encode()]), ByteVocab([b"b1", b"a", "\U0001F600".encode()])
    alignment, sent, our_ids = _aligned(sender, ours, text)
    assert (alignment.our_span >= 0).all() and alignment.our_span[-1] == alignment.spans - 1
    assert np.all(np.diff(alignment.our_span) >= 0) and np.all(np.diff(alignment.sender_span[: sent.tokens]) >= 0)
    assert set(alignment.sender_span[: sent.tokens]) == set(alignment.our_span) == set(range(alignment.spans))


def test_tiny_llama_is_another_family_whose_completions_align_with_tiny_s():
    """The second family's tokenizer keeps numbers together and spells spaces as '▁', so on
    arithmetic it shares few boundaries with tiny's (one digit a token); any text still
    round-trips through it by byte fallback, and a tiny completion aligns in spans of both."""
    tiny, other = build_tokenizer(TINY_SPEC), build_tokenizer(TINY_LLAMA_SPEC)
    assert isinstance(build_model(other, TINY_LLAMA_SPEC), LlamaForCausalLM) and len(other) != len(tiny)
    for text in ("Compute 123 - 45 = <answer>78</answer>", "x \U0001F600 é\n"):
        assert other.decode(other(text, add_special_tokens=False)["input_ids"]) == text
    completion = "<answer>1078</answer> 99"
    tiny_ids = tiny(completion, add_special_tokens=False)["input_ids"]
    sent = sender_text(tiny_ids, tiny.decode)
    our_text, our_ends = token_ends(other(sent.text, add_special_tokens=False)["input_ids"], other.decode)
    assert our_text == completion
    alignment = align(sent.ends, our_ends, len(completion))
    assert not alignment.token_level and alignment.spans < len(tiny_ids), "1078 and 99 are one span each"


def _side(tokenizer) -> Tokenization:
    return family_of(tokenizer).tokenization  # as a node reads a peer's tokens


def test_a_finished_tiny_completion_translates_into_tiny_llama_tokens_with_its_log_prob_kept():
    """Every log-prob the sender reported lands in exactly one span, the text is the same on
    both sides, and the sender's EOS is a span of its own on our EOS."""
    tiny, other = build_tokenizer(TINY_SPEC), build_tokenizer(TINY_LLAMA_SPEC)
    ids = np.array([*tiny("<answer>1078</answer>", add_special_tokens=False)["input_ids"], tiny.eos_token_id])
    logprobs = -np.linspace(0.1, 1.0, len(ids)).astype(np.float32)
    translated = translate(ids, logprobs, _side(tiny), _side(other))
    assert translated is not None and translated.tokens[-1] == other.eos_token_id
    assert other.decode(translated.tokens[:-1]) == "<answer>1078</answer>"
    assert len(translated.spans.of_token) == len(translated.tokens)
    assert translated.spans.gen.sum() == pytest.approx(logprobs.sum(), rel=1e-6)
    assert translated.spans.gen[-1] == pytest.approx(logprobs[-1]) and translated.spans.of_token[-1] == len(translated.spans.gen) - 1
    back = translate(translated.tokens, translated.spans.gen[translated.spans.of_token], _side(other), _side(tiny))
    assert back is not None and list(back.tokens) == list(ids), "and back again: the same tokens"


def test_a_completion_that_does_not_survive_our_tokenizer_is_not_translated():
    tiny = build_tokenizer(TINY_SPEC)
    ids = np.array(tiny("12+3", add_special_tokens=False)["input_ids"])
    lossy = Tokenization(decode=lambda ids: "", encode=lambda text: [1], eos=0)  # decodes to other text
    assert translate(ids, np.zeros(len(ids), np.float32), _side(tiny), lossy) is None


def test_an_unfinished_character_drops_the_eos_after_it():
    vocab = ByteVocab([])
    eos = len(vocab.pieces)  # an id past the vocabulary, decoding to nothing
    side = Tokenization(decode=lambda ids: vocab.decode([i for i in ids if i != eos]), encode=vocab.encode, eos=eos)
    ids = np.array([*vocab.encode("ab€")[:-1], eos])
    translated = translate(ids, np.full(len(ids), -0.5, np.float32), side, side)
    assert translated is not None and list(translated.tokens) == vocab.encode("ab"), "no EOS: it ends unfinished"
    assert list(translated.spans.gen) == [-0.5, -0.5]


def _prefix_ends(ids, decode):
    """The definition token_ends streams: where each prefix's own decoding ends in the text."""
    text = decode(ids)
    ends = []
    for count in range(1, len(ids) + 1):
        prefix = decode(ids[:count])
        ends.append(len(prefix) if text.startswith(prefix) and not prefix.endswith("\ufffd") else None)
    return ends


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("0123456789+-= <>/answerCé€\U0001F600\n")), min_size=1, max_size=60))
def test_streamed_boundaries_are_where_each_prefix_s_own_decoding_ends(text):
    """Linear work, the same boundaries as decoding every prefix, for both families' tokenizers
    and a byte vocabulary (pieces of characters included)."""
    for tokenizer in (_TINY, _LLAMA):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert token_ends(ids, tokenizer.decode)[1] == _prefix_ends(ids, tokenizer.decode)
    vocab = ByteVocab([b"12", "€".encode()[:2]])
    ids = vocab.encode(text)
    assert token_ends(ids, vocab.decode)[1] == _prefix_ends(ids, vocab.decode)


def test_tokens_that_never_make_a_character_end_the_boundaries_after_a_while():
    """Lone continuation bytes never decode cleanly: after MAX_PENDING of them nothing more is
    decoded, so such junk costs linear work, not quadratic."""
    vocab = ByteVocab([])
    ids = vocab.encode("ab") + [vocab.ids[b"\x80"]] * 1000
    calls = []
    text, ends = token_ends(ids, lambda part: calls.append(len(part)) or vocab.decode(part))
    assert ends[:2] == [1, 2] and ends[2:] == [None] * 1000
    assert sum(calls) < 40 * MAX_PENDING + len(ids)


def test_a_translation_longer_than_our_limit_is_cut_at_its_last_whole_span():
    """Numbers kept whole in the sender's tokens are a digit a token in ours: past our own
    generation limit the completion ends at a span boundary, unfinished (no EOS)."""
    ids = np.array([*_LLAMA("<answer>1078</answer>", add_special_tokens=False)["input_ids"], _LLAMA.eos_token_id])
    logprobs = np.full(len(ids), -0.25, np.float32)
    whole = translate(ids, logprobs, _side(_LLAMA), _side(_TINY))
    assert whole is not None and len(whole.tokens) == 7, "<answer> 1 0 7 8 </answer> EOS"
    cut = translate(ids, logprobs, _side(_LLAMA), _side(_TINY), max_tokens=4)
    assert cut is not None and len(cut.tokens) <= 4 and _TINY.eos_token_id not in cut.tokens
    assert "<answer>1078</answer>".startswith(_TINY.decode(cut.tokens))
    assert len(cut.spans.gen) == cut.spans.of_token[-1] + 1 and list(cut.spans.of_token) == list(whole.spans.of_token[: len(cut.tokens)])
    assert translate(ids, logprobs, _side(_LLAMA), _side(_TINY), max_tokens=len(whole.tokens)).tokens.tolist() == whole.tokens.tolist()
