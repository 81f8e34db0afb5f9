"""Two tokenizations of one completion, cut where both have a boundary: how a peer of another
tokenizer family is trained on.

A peer of another model family samples tokens of its own vocabulary and reports their log-probs.
We train on the same text in our tokens, so the importance weight pi_theta / pi_gen needs both
policies' probability of the same event. Where both segmentations have a token boundary at the
same character, the text between two such shared boundaries (a span) is one event to both: the
sender's log-prob of it is the sum of its tokens' log-probs, ours the sum of ours, and their
difference is the span's log-ratio, which every one of our tokens in the span takes as its own
(`Spans.log_ratios`, `SpanBatch`). When the two tokenizations share every boundary, each span is one token and
this is the token-level weight exactly.

A boundary counts only where it is clean: the tokens up to it decode to a prefix of the whole
text. A token that ends inside a character (byte fallback, a byte-level BPE cutting a multi-byte
character), or a decoder that rewrites earlier text once more tokens follow, leaves no boundary
there, so the span simply grows past it. A sender's completion cut off inside a character ends
in a replacement character: its text is taken up to the sender's last clean boundary, and the
tokens after it are dropped with their log-probs (`sender_text`). The sender's log-prob of a span
is that of the segmentation it sampled, a lower bound on the probability of the span's text
under its model (other segmentations of the same text have probability too), as for any
cross-tokenizer estimate built from sampled tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

Decode = Callable[[Sequence[int]], str]
REPLACEMENT = "\ufffd"  # what a decoder shows for bytes that are not (yet) a whole character


MAX_PENDING = 16  # tokens without a whole character among them before a completion's boundaries end


def token_ends(ids: Sequence[int], decode: Decode) -> tuple[str, list[int | None]]:
    """The text `ids` decode to, and per token the character offset where the text of the tokens
    up to it ends (None where they end inside a character, shown as a replacement character,
    or where the decoder rewrote what came before: no boundary there).

    Decoded incrementally, as a streaming detokenizer does: each step decodes a window that
    starts one emitted chunk back, so a decoder that treats the first token of a call apart
    (sentencepiece's leading space) sees the same context every time, and each emitted piece
    must continue the whole text where the last one ended. The work is linear in the length;
    after MAX_PENDING tokens without a clean end, the rest has no boundaries (a completion that
    is not text anyway)."""
    text = decode(ids)
    ends: list[int | None] = []
    emitted, start, read = 0, 0, 0  # characters accounted for; the window's first token; tokens emitted
    for count in range(1, len(ids) + 1):
        if count - read > MAX_PENDING:
            ends += [None] * (len(ids) - len(ends))
            break
        context = decode(ids[start:read]) if read > start else ""
        window = decode(ids[start:count])
        piece = window[len(context):]
        if piece and window.startswith(context) and not window.endswith(REPLACEMENT) and text.startswith(piece, emitted):
            emitted += len(piece)
            ends.append(emitted)
            start, read = read, count
        else:
            ends.append(None)
    return text, ends


@dataclass(frozen=True)
class SenderText:
    """The part of a sender's completion we can train on: its text and token boundaries."""

    text: str
    ends: list[int | None]  # per sender token, as token_ends; tokens past `text` are None
    tokens: int  # how many of the sender's tokens `text` covers (the rest are dropped)


def sender_text(ids: Sequence[int], decode: Decode) -> SenderText:
    """Decode a sender's completion with its tokenizer, cut at its last clean boundary so an
    unfinished character at the end (a completion stopped by its token limit) is dropped."""
    text, ends = token_ends(ids, decode)
    last = max((k for k, end in enumerate(ends) if end is not None), default=-1)
    cut = ends[last] if last >= 0 else 0
    return SenderText(text[:cut], ends[: last + 1] + [None] * (len(ids) - last - 1), last + 1)


@dataclass(frozen=True)
class Alignment:
    """Both tokenizations of one text, by span: the text between consecutive shared boundaries."""

    spans: int
    sender_span: np.ndarray  # int64 per sender token: its span, -1 for a token past the text
    our_span: np.ndarray  # int64 per token of ours: its span

    @property
    def token_level(self) -> bool:
        """Every span is one token of each: the two agree on every boundary."""
        return len(self.sender_span) == len(self.our_span) == self.spans and bool((self.sender_span >= 0).all())


def align(sender_ends: Sequence[int | None], our_ends: Sequence[int | None], length: int) -> Alignment:
    """Cut a text of `length` characters at the boundaries both tokenizations have cleanly.

    `sender_ends` and `our_ends` are per-token end offsets as token_ends gives them; the sender's
    may run past `length` (dropped tokens, None). Our last token must end cleanly at `length`,
    and so must one of the sender's: the same text, whole, on both sides."""
    if length == 0:
        raise ValueError("nothing to align: the text is empty")
    if not our_ends or our_ends[-1] != length:
        raise ValueError("our tokens do not end cleanly at the end of the text")
    sender_clean = {end for end in sender_ends if end is not None}
    if length not in sender_clean:
        raise ValueError("the sender's tokens do not end cleanly at the end of the text")
    shared = sender_clean & {end for end in our_ends if end is not None}
    shared = {end for end in shared if end <= length}
    span_at = {end: k for k, end in enumerate(sorted(shared))}  # the span a shared boundary closes
    our_span = _span_of(our_ends, span_at, length)
    our_span[our_span < 0] = len(shared) - 1  # tokens of ours after the text's end that add no text: the last span
    return Alignment(len(shared), _span_of(sender_ends, span_at, length), our_span)


def _span_of(ends: Sequence[int | None], span_at: dict[int, int], length: int) -> np.ndarray:
    """Per token, the span it lies in: the one the next shared boundary at or after it closes."""
    spans = np.full(len(ends), -1, dtype=np.int64)
    pending: list[int] = []  # tokens since the last shared boundary
    for k, end in enumerate(ends):
        pending.append(k)
        if end is not None and end in span_at:
            spans[pending] = span_at[end]
            pending = []
        if end == length:
            break
    return spans


@dataclass(frozen=True)
class Spans:
    """One sample's spans as the loss takes them: per token of ours its span, per span the
    sender's log-prob (`spans_of`)."""

    of_token: np.ndarray  # int64 per completion token of ours
    gen: np.ndarray  # float32 per span

    @staticmethod
    def token_level(gen_logprobs: np.ndarray) -> Spans:
        """Each token its own span: what a sample of our own tokenizer is."""
        return Spans(np.arange(len(gen_logprobs), dtype=np.int64), np.asarray(gen_logprobs, dtype=np.float32))

    def sums(self, logp_theta: np.ndarray) -> np.ndarray:
        """Per span: our log-prob of its text, the sum of its tokens' (float64)."""
        return np.bincount(self.of_token, weights=np.asarray(logp_theta, np.float64), minlength=len(self.gen))

    def log_ratios(self, logp_theta: np.ndarray) -> np.ndarray:
        """Per token of ours: log pi_theta - log pi_gen of its span."""
        return (self.sums(logp_theta) - self.gen)[self.of_token]


def spans_of(alignment: Alignment, sender_logprobs: np.ndarray) -> Spans:
    """Our tokens' spans, with the sender's log-prob of each: the sum of its tokens' in the
    span (its tokens past the aligned text count nowhere)."""
    inside = alignment.sender_span >= 0
    logprobs = np.asarray(sender_logprobs, np.float64)[: len(alignment.sender_span)]
    gen = np.bincount(alignment.sender_span[inside], weights=logprobs[inside], minlength=alignment.spans)
    return Spans(alignment.our_span, gen.astype(np.float32))


@dataclass(frozen=True)
class SpanBatch:
    """Spans of a padded batch of sequences: the loss's events when a row's tokens are not the
    generator's own. Row b's tokens are grouped into spans 0..S_b-1; padding belongs to none."""

    of_token: torch.Tensor  # [B, T] int64, -1 on padding
    gen: torch.Tensor  # [B, S] the generator's log-prob of each span, 0 past a row's spans
    mask: torch.Tensor  # [B, S] 1 for a real span

    @staticmethod
    def of(rows: Sequence[Spans], width: int, device: torch.device | str = "cpu") -> SpanBatch:
        spans = max((len(row.gen) for row in rows), default=0)
        of_token = torch.full((len(rows), width), -1, dtype=torch.int64)
        gen = torch.zeros((len(rows), spans), dtype=torch.float32)
        mask = torch.zeros((len(rows), spans), dtype=torch.float32)
        for b, row in enumerate(rows):
            of_token[b, : len(row.of_token)] = torch.tensor(row.of_token)  # a copy: a wire view is read-only
            gen[b, : len(row.gen)] = torch.tensor(row.gen)
            mask[b, : len(row.gen)] = 1.0
        return SpanBatch(of_token.to(device), gen.to(device), mask.to(device))

    def sums(self, per_token: torch.Tensor) -> torch.Tensor:
        """[B, T] per-token values summed within each span: [B, S]."""
        rows, spans = self.gen.shape
        slot = torch.where(self.of_token >= 0, self.of_token + spans * torch.arange(rows, device=per_token.device)[:, None], rows * spans)
        total = torch.zeros(rows * spans + 1, dtype=per_token.dtype, device=per_token.device)  # the last slot takes padding
        return total.index_add(0, slot.flatten(), per_token.flatten())[:-1].view(rows, spans)

    def spread(self, per_span: torch.Tensor) -> torch.Tensor:
        """[B, S] per-span values given to each token of the span: [B, T] (0 on padding)."""
        values = per_span.gather(1, self.of_token.clamp_min(0))
        return torch.where(self.of_token >= 0, values, torch.zeros_like(values))


@dataclass(frozen=True)
class Tokenization:
    """What translating needs of one side's tokenizer: decode, encode (no special tokens
    added) and its end-of-sequence id."""

    decode: Decode
    encode: Callable[[str], list[int]]
    eos: int


@dataclass(frozen=True)
class Translated:
    """A sender's completion in our tokens, with the sender's log-probs by span."""

    tokens: np.ndarray  # int32, ours
    spans: Spans


def translate(
    ids: np.ndarray, logprobs: np.ndarray, sender: Tokenization, ours: Tokenization, max_tokens: int | None = None,
) -> Translated | None:
    """A completion of another tokenizer as we would train on it, or None when it cannot be.

    The text is the sender's tokens decoded by its tokenizer (up to its last whole character)
    and encoded by ours; it must decode back to the same text, or the sample is not the one the
    sender generated (None). A final end-of-sequence token is that same event to both, so it is
    a span of its own: our EOS against the sender's log-prob of its EOS. When the tail of the
    text was dropped (an unfinished character), so is a final EOS: the completion ends unfinished.
    More than `max_tokens` of ours (our own generation limit: what memory was planned for) are
    cut at the last span that fits, as if our generator had stopped there, unfinished.
    """
    ids = np.asarray(ids)
    finished = len(ids) > 0 and int(ids[-1]) == sender.eos
    body = ids[:-1] if finished else ids
    sent = sender_text([int(i) for i in body], sender.decode)
    finished = finished and sent.tokens == len(body)
    our_ids = ours.encode(sent.text) if sent.text else []
    if sent.text:
        our_text, our_ends = token_ends(our_ids, ours.decode)
        if our_text != sent.text or our_ends[-1] != len(sent.text):
            return None
        aligned = spans_of(align(sent.ends, our_ends, len(sent.text)), logprobs[: len(body)])
        of_token, span_gen, spans = aligned.of_token, aligned.gen, len(aligned.gen)
    else:
        span_gen, of_token, spans = np.zeros(0), np.zeros(0, np.int64), 0
    if finished:
        our_ids = [*our_ids, ours.eos]
        of_token = np.append(of_token, spans)
        span_gen = np.append(span_gen, float(logprobs[-1]))
    if max_tokens is not None and len(our_ids) > max_tokens:
        cut = max_tokens
        while cut > 0 and of_token[cut - 1] == of_token[cut]:  # whole spans only
            cut -= 1
        our_ids, of_token = our_ids[:cut], of_token[:cut]
        span_gen = span_gen[: int(of_token[-1]) + 1] if cut else span_gen[:0]
    if not our_ids:
        return None
    return Translated(np.asarray(our_ids, np.int32), Spans(np.asarray(of_token, np.int64), span_gen.astype(np.float32)))
