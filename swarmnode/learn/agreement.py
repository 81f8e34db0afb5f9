"""Whether a peer's samples would move our model the way our own samples do.

What a peer's samples are worth to us is what they do to our update, not how they score or how
likely our model finds them: a far peer's correct, likely-looking samples can still pull the
weights somewhere our own samples do not. So the step measures it: the gradient of the loss on
each source's samples (ours in two halves, then each peer's) over a probe of the model's
parameters, and the cosine of each peer's gradient with ours. Two halves of our own samples give
the yardstick: how well two batches of our own on-policy samples agree, which RL's gradient noise
keeps far below 1. A copy of our model agrees with us about as well as our halves agree with each
other (better, as its batch is not halved); a far peer's samples agree less, or point away.

The probe is the last parameters of the model, up to PROBE_ELEMENTS values: the whole of a tiny
model or of LoRA adapters, the top of a large one, so that the copies it takes stay small beside
the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

PROBE_ELEMENTS = 20_000_000  # values of the probe: 80 MB a copy in fp32


def probe_parameters(parameters: list[torch.nn.Parameter], limit: int = PROBE_ELEMENTS) -> list[torch.nn.Parameter]:
    """The last trainable parameters whose sizes sum to at most `limit` (always at least one)."""
    chosen: list[torch.nn.Parameter] = []
    total = 0
    for parameter in reversed([p for p in parameters if p.requires_grad]):
        if chosen and total + parameter.numel() > limit:
            break
        chosen.append(parameter)
        total += parameter.numel()
    return chosen


class GradientProbe:
    """The gradient accumulated on the probe since the last `take`: one source's share of the step."""

    def __init__(self, parameters: list[torch.nn.Parameter]) -> None:
        self.parameters = parameters
        self.last = self._flat()

    def _flat(self) -> torch.Tensor:
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().reshape(-1)
                          for p in self.parameters])

    def take(self) -> torch.Tensor:
        now = self._flat()
        share, self.last = now - self.last, now
        return share


def cosine(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """Their cosine, or None where either is zero (nothing to compare)."""
    norms = float(a.norm()) * float(b.norm())
    return float(a @ b) / norms if norms > 0 else None


@dataclass
class StepAgreement:
    """One step's cosines: of our two halves (the yardstick), and of each peer's gradient with ours."""

    own_halves: float | None
    peers: dict[str, float] = field(default_factory=dict)

    @staticmethod
    def of(first_half: torch.Tensor, second_half: torch.Tensor, peers: dict[str, torch.Tensor]) -> StepAgreement:
        ours = first_half + second_half
        found = {peer: cosine(ours, gradient) for peer, gradient in peers.items()}
        return StepAgreement(cosine(first_half, second_half), {p: c for p, c in found.items() if c is not None})
