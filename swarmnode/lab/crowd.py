"""Crowds for the attack bench: identities that look useful (the answers of a public task,
no model needed), and identities that look like an honest peer with nothing to teach.

A verifiable public task's answers are public, so a stranger needs no model to send groups
that score well: half of each group the right answer in the model's own format, half a
plausible wrong one, so every sample carries a non-zero advantage. With a `payload` (a few
tokens the public starting model finds fairly likely, see `drift_payload`, or those a peer
running the same base model finds closest to the gate's bar, `stealthiest_payload`) before each right
answer, the crowd tries to walk the likelihood gate: each payload sample that passes makes
the next one likelier under the model it is judged by. Without one, it tries to take the
peers' share of a batch by numbers. Log-probs are reported truthfully under the public
starting model, the most weight an honest generator's could buy. bench/attacks.py `drift`,
`first-crowd` and `useful-crowd` measure them.

Such groups repeat two completions four times each, far more often than their log-probs allow,
and a node finds them picked, not sampled (swarmnode.screening.repeats). With a `sampler` the
crowd runs the public model instead and only puts the right answer (after the payload) in place
of its first sample: its groups repeat as sampling does, and it costs a generate call a round
(every new group of the round in one).
With `padding` (and a sampler) it writes only some groups of each batch and fills the rest with
the public model's plain samples, to keep its evidence of picking low.

`UselessCrowd` is the other end: near identities that try to teach nothing, to hold the turn a
node gives a useless near peer on probation (swarmnode.loop.pool.fair_queue: every 4th round,
and every round while far peers fill its share). bench/attacks.py `probation-crowd` measures it.
"""

from __future__ import annotations

import numpy as np
import torch

from swarmnode.model.families import family_of
from swarmnode.model.policy import Policy
from swarmnode.protocol import wire
from swarmnode.protocol.batches import assigned_prompt_ids
from swarmnode.protocol.prompts import build_prompt
from swarmnode.rollout.base import Generator
from swarmnode.screening.gate import least_likely_window
from swarmnode.settings.config import Config
from swarmnode.swarm.base import RolloutExchange
from swarmnode.tasks.base import Problem, Task

ANSWER_OPEN = "<answer>"


def drift_payload(policy: Policy, task: Task, length: int, prompts: int = 32) -> list[int]:
    """`length` tokens chosen greedily as the most likely visible tokens, at the start of a
    completion, that are not the answer's own (its tags, digits, a sign), nor blank nor special:
    under the public model, the text a patient attacker would try to teach first."""
    if length <= 0:
        return []
    tokenizer = policy.tokenizer
    banned = set(tokenizer.all_special_ids)
    for token_id in range(len(tokenizer)):
        text = tokenizer.decode([token_id])
        if not text.strip() or _answer_like(text):
            banned.add(token_id)
    chosen: list[int] = []
    bases = [build_prompt(task, task.train_problem(i), policy) for i in range(min(prompts, task.num_train))]
    for _ in range(length):
        rows = []
        with torch.no_grad():
            for prompt in bases:
                ids = torch.tensor([prompt + chosen], device=policy.device)
                rows.append(torch.log_softmax(policy.model(input_ids=ids).logits[0, -1].float(), -1))
        mean = torch.stack(rows).mean(0)
        mean[list(banned & set(range(mean.shape[0])))] = -float("inf")
        chosen.append(int(mean.argmax()))
    return chosen


def stealthiest_payload(policy: Policy, task: Task, length: int, window: int, prompts: int = 16) -> list[int]:
    """`length` tokens chosen greedily, one at a time, so that a right answer with them before
    its answer block scores highest on the likelihood gate (the mean of each completion's least
    likely `window` tokens) under `policy`, the public starting weights: the payload an
    attacker who runs the same base model can find, closest to the anchored gate's bar. The
    answer's own tokens (digits, tags, a sign) and special tokens are not candidates."""
    if length <= 0:
        return []
    tokenizer = policy.tokenizer
    banned = set(tokenizer.all_special_ids)
    candidates = [t for t in range(len(tokenizer)) if t not in banned and not _answer_like(tokenizer.decode([t]))]
    problems = [task.train_problem(i) for i in range(min(prompts, task.num_train))]
    bases = [build_prompt(task, p, policy) for p in problems]
    answers = [tokenizer(f"{ANSWER_OPEN}{p.answer}</answer>", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
               for p in problems]

    def score(prefix: list[int]) -> float:
        completions = [np.array(prefix + answer, dtype=np.int32) for answer in answers]
        logprobs = policy.token_logprobs(bases, completions, 1.0)
        return float(np.mean([least_likely_window(lp, window) for lp in logprobs]))

    chosen: list[int] = []
    for _ in range(length):
        chosen.append(max(candidates, key=lambda t: score(chosen + [t])))
    return chosen


def _answer_like(text: str) -> bool:
    """Text of the answer's own: a digit, an answer tag, a sign."""
    return any(c.isdigit() for c in text) or "answer>" in text or text.strip() == "-"


def starts_with(tokens: np.ndarray, payload: list[int]) -> bool:
    """Whether a completion starts with `payload` (an empty one: never)."""
    n = len(payload)
    return bool(n) and len(tokens) >= n and [int(t) for t in tokens[:n]] == payload


def off_by_one(answer: str) -> str:
    """A plausible wrong answer: the number plus one, else a digit appended."""
    try:
        return str(int(answer) + 1)
    except ValueError:
        return answer + "1"


class UsefulCrowd:
    """`identities` in one process, each publishing a batch a call through its own exchange."""

    def __init__(
        self,
        exchanges: list[RolloutExchange],
        run_id: str,
        config: Config,
        task: Task,
        public: Policy,
        payload: list[int],
        groups: int = 16,
        sampler: Generator | None = None,
        padding: float = 0.0,
    ) -> None:
        if padding and sampler is None:
            raise ValueError("padding fills batches with the public model's samples: give a sampler")
        if not 0.0 <= padding < 1.0:
            raise ValueError(f"padding is the share of plain sampled groups, in [0, 1): got {padding}")
        self.exchanges, self.run_id, self.config, self.task = exchanges, run_id, config, task
        self.public, self.payload, self.groups, self.sampler = public, payload, groups, sampler
        # groups of a batch it writes (the first ones; a node takes them in an order of its own)
        self.written = self.written_of(groups, padding)
        self._padding = padding
        self._cache: dict[tuple[int, bool], wire.CompletionGroup] = {}  # (prompt id, plain sample) -> its group
        self.digest = family_of(public.tokenizer).digest  # the public model's tokenizer, as its batches name it

    @staticmethod
    def written_of(groups: int, padding: float) -> int:
        """Groups of a batch of `groups` written when `padding` of them are plain samples (one at least)."""
        return max(1, round(groups * (1.0 - padding)))

    def publish(self, round_: int) -> None:
        keys_of = {  # per identity, its batch's (prompt id, plain sample) in order
            exchange.peer_id: [(i, n >= self.written) for n, i in enumerate(
                assigned_prompt_ids(self.config.node.seed, exchange.peer_id, round_, self.groups, self.task.num_train))]
            for exchange in self.exchanges
        }
        self._make_groups([key for keys in keys_of.values() for key in keys])
        for exchange in self.exchanges:
            batch = wire.RolloutBatch(
                run_id=self.run_id, peer_id=exchange.peer_id, round=round_,
                tokenizer_digest=self.digest, groups=[self._cache[key] for key in keys_of[exchange.peer_id]],
            )
            exchange.publish(round_, wire.encode(batch), batch.num_tokens)

    def carries_payload(self, tokens: np.ndarray) -> bool:
        """Whether a completion starts with the payload (none: never)."""
        return starts_with(tokens, self.payload)

    def _make_groups(self, keys: list[tuple[int, bool]]) -> None:
        """Cache the groups of (prompt id, plain sample) `keys` not made yet, all of a round in one
        generate call and one scoring pass: one small model's call a group costs several times
        as much (a crowd of six sends 96 groups a round)."""
        missing = list(dict.fromkeys(key for key in keys if key not in self._cache))
        if not missing:
            return
        tokenizer = self.public.tokenizer
        limit = self.config.rollout.max_new_tokens
        size = self.config.rollout.group_size

        def completion(answer: str, prefix: list[int]) -> np.ndarray:
            ids = prefix + tokenizer(f"{ANSWER_OPEN}{answer}</answer>", add_special_tokens=False)["input_ids"]
            ids = (ids + [tokenizer.eos_token_id])[:limit]
            return np.array(ids, dtype=np.int32)

        problems = [self.task.train_problem(prompt_id) for prompt_id, _ in missing]
        prompts = [build_prompt(self.task, problem, self.public) for problem in problems]
        samples_every_group = self.sampler is not None and not self._padding  # else only plain (padding) groups
        to_sample = [n for n, (_, plain) in enumerate(missing) if plain or samples_every_group]
        sampled: dict[int, list[np.ndarray]] = {}  # index in `missing` -> the public model's samples
        if to_sample:
            groups = self.sampler.generate([prompts[n] for n in to_sample], size)
            sampled = {n: [c.tokens for c in group] for n, group in zip(to_sample, groups)}
        made: list[list[np.ndarray]] = []
        for n, ((_, plain), problem) in enumerate(zip(missing, problems)):
            if plain:  # padding: the public model's own samples, as an honest peer of it sends
                made.append(sampled[n])
            elif samples_every_group:  # its own samples, the first one the right answer
                made.append([completion(problem.answer, self.payload)] + sampled[n][1:])
            else:
                right = [completion(problem.answer, self.payload) for _ in range(size - size // 2)]
                wrong = [completion(off_by_one(problem.answer), []) for _ in range(size // 2)]
                made.append(right + wrong)
        flat_prompts = [prompt for prompt in prompts for _ in range(size)]
        logprobs = self.public.token_logprobs(flat_prompts, [c for group in made for c in group], self.config.rollout.temperature)
        for n, (key, completions) in enumerate(zip(missing, made)):
            group_logprobs = logprobs[n * size : (n + 1) * size]
            self._cache[key] = wire.CompletionGroup.of(
                key[0], [wire.Completion(c, lp.astype(np.float32)) for c, lp in zip(completions, group_logprobs)]
            )


class UselessCrowd:
    """Identities that look like an honest near peer that early luck left useless: each
    publishes one group a round (a batch may be any prefix of its assignment) of the public
    model's own samples, drawn `draws` times over and the group made of wrong answers only, so
    it teaches nothing under any baseline (an all-right group would: under `loss.peer_baseline`
    lower it is taken against our own lower mean). Its log-probs are the sampler's and no
    completion is written, so screening finds it useless, never a liar; choosing among draws
    raises its repeats by at most 1 / P(wrong) over what its log-probs claim, which the repeat
    test's slack (a nat) covers while over 1 / e of its draws are wrong. An identity with too few wrong
    answers in its draws sends nothing that round."""

    def __init__(self, exchanges: list[RolloutExchange], run_id: str, config: Config, task: Task, public: Policy,
                 sampler: Generator, draws: int = 4) -> None:
        if draws < 1:
            raise ValueError(f"draws is how many groups' worth of samples a group is chosen from, at least 1: got {draws}")
        self.exchanges, self.run_id, self.config, self.task = exchanges, run_id, config, task
        self.public, self.sampler, self.draws = public, sampler, draws
        self.digest = family_of(public.tokenizer).digest
        self.published = 0  # groups sent so far

    def renew(self, exchanges: list[RolloutExchange]) -> None:
        """Publish from these identities from now on, the old ones abandoned: a crowd that
        churns, so that each identity is a newcomer again, never screened enough to be found
        useless (loop.ledger.USELESS_AFTER) nor measured far."""
        self.exchanges = exchanges

    def publish(self, round_: int) -> None:
        """One group from each identity (its first assigned prompt), all of a round's draws in one generate call."""
        if not self.exchanges:
            return
        size = self.config.rollout.group_size
        prompt_ids = [assigned_prompt_ids(self.config.node.seed, exchange.peer_id, round_, 1, self.task.num_train)[0]
                      for exchange in self.exchanges]
        problems = [self.task.train_problem(i) for i in prompt_ids]
        prompts = [build_prompt(self.task, problem, self.public) for problem in problems]
        for exchange, prompt_id, problem, samples in zip(
                self.exchanges, prompt_ids, problems, self.sampler.generate(prompts, size * self.draws)):
            wrong = self.wrong(samples, problem, size)
            if wrong is None:
                continue
            batch = wire.RolloutBatch(
                run_id=self.run_id, peer_id=exchange.peer_id, round=round_, tokenizer_digest=self.digest,
                groups=[wire.CompletionGroup.of(prompt_id, wrong)],
            )
            exchange.publish(round_, wire.encode(batch), batch.num_tokens)
            self.published += 1

    def wrong(self, samples: list[wire.Completion], problem: Problem, size: int) -> list[wire.Completion] | None:
        """The first `size` of `samples` that score 0 under the task, or None where fewer do."""
        wrong = [c for c in samples if self.task.reward(self.public.decode(c.tokens), problem) == 0.0]
        return wrong[:size] if len(wrong) >= size else None
