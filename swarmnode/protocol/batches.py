"""What a peer's batch must be: the prompts its sender was assigned, the batch split of a
round, and the checks a batch passes before this node trains on it.

Prompts are fixed by (run seed, peer, the peer's own round), so nobody cherry-picks easy
ones; everything here is computed by the receiver, never taken from the sender's word.
"""

from __future__ import annotations

import random

from swarmnode.protocol import wire
from swarmnode.settings.config import Config


def assigned_prompt_ids(seed: int, peer_id: str, round_: int, count: int, num_train: int) -> list[int]:
    """The prompts a peer must use in a round: fixed by (seed, peer, round), no cherry-picking.

    The first `count` distinct ids of one seeded stream, so a peer that generates fewer prompts
    (a smaller own share) uses a prefix of the same assignment, and any count can be checked."""
    rng = random.Random(f"{seed}:{peer_id}:{round_}")
    wanted = min(count, num_train)
    ids: list[int] = []
    seen: set[int] = set()
    while len(ids) < wanted:
        candidate = rng.randrange(num_train)
        if candidate not in seen:
            seen.add(candidate)
            ids.append(candidate)
    return ids


def batch_split(config: Config, own_share: float | None = None) -> tuple[int, int]:
    """(groups this node generates, most peers' groups it trains on) in one round.

    The training batch is `rollout.prompts_per_round` groups. With `node.own_share` 1 the node
    generates all of them and peers' groups come on top (up to `node.max_peer_groups`, by
    default as many as its own, so no number of peers makes a step more than twice the work);
    below 1 it generates that share and peers' groups fill the rest, so it learns from a full
    batch for a fraction of the generation (the paper's vertical setup, SAPO's local/external
    split). `own_share` overrides the setting for this round (swarmnode.loop.share)."""
    batch = config.rollout.prompts_per_round
    share = config.node.own_share if own_share is None else own_share
    cap = batch if config.node.max_peer_groups is None else config.node.max_peer_groups
    if config.node.own_share >= 1.0:  # on top; a share that adapted up to 1 leaves peers no room
        return batch, cap
    own = max(1, round(share * batch))
    return own, min(cap, batch - own)


def check_batch(
    batch: wire.RolloutBatch, sender: str, round_: int, config: Config, run_id: str, vocab_size: int | None,
    num_train: int,
) -> None:
    """WireError unless `batch` is one this node may train on: this run, from its sender, of
    the round it was published as, token ids inside the vocabulary of the tokenizer it names
    (`vocab_size`; None: a tokenizer this node does not know, whose ids it cannot judge), the
    sender's assigned prompts, the run's group size and completion length (in the sender's own
    tokens)."""
    if batch.run_id != run_id:
        raise wire.WireError(f"run id {batch.run_id} is not this run ({run_id})")
    if batch.peer_id != sender:
        raise wire.WireError(f"claims to be {batch.peer_id} but came from {sender}")
    if batch.round != round_:
        raise wire.WireError(f"round {batch.round} published as round {round_}")
    highest = max((int(g.tokens.max()) for g in batch.groups if len(g.tokens)), default=-1)
    if vocab_size is not None and highest >= vocab_size:
        raise wire.WireError(f"token id {highest} outside the vocabulary of the tokenizer it names ({vocab_size})")
    if not batch.groups:
        raise wire.WireError("a batch without groups")
    expected = assigned_prompt_ids(config.node.seed, batch.peer_id, batch.round, len(batch.groups), num_train)
    # a peer may generate any number of prompts (its own share), always its first ones
    if sorted(g.prompt_id for g in batch.groups) != sorted(expected):
        raise wire.WireError("prompt ids differ from the peer's assignment for that round")
    if any(len(g.lengths) != config.rollout.group_size for g in batch.groups):
        raise wire.WireError("group size differs from this run's")
    longest = max((int(g.lengths.max()) for g in batch.groups if len(g.lengths)), default=0)
    if longest > config.rollout.max_new_tokens:
        raise wire.WireError(
            f"a completion of {longest} tokens; this run generates at most {config.rollout.max_new_tokens}"
        )
