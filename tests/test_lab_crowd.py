"""The lab's useful-looking crowd: the payload a same-base attacker would pick."""

import numpy as np

from swarmnode.lab.crowd import ANSWER_OPEN, drift_payload, stealthiest_payload
from swarmnode.protocol.prompts import build_prompt
from swarmnode.screening.gate import least_likely_window
from swarmnode.settings.config import TaskSettings
from swarmnode.tasks import make_task


def _gate_score(policy, task, payload, window=4, prompts=4):
    problems = [task.train_problem(i) for i in range(prompts)]
    tokenizer = policy.tokenizer
    completions = [
        np.array(payload + tokenizer(f"{ANSWER_OPEN}{p.answer}</answer>", add_special_tokens=False)["input_ids"]
                 + [tokenizer.eos_token_id], dtype=np.int32)
        for p in problems
    ]
    logprobs = policy.token_logprobs([build_prompt(task, p, policy) for p in problems], completions, 1.0)
    return float(np.mean([least_likely_window(lp, window) for lp in logprobs]))


def test_the_stealthiest_payload_scores_at_least_as_well_as_other_payloads(make_policy):
    policy = make_policy(hidden=32, layers=1)
    task = make_task(TaskSettings(name="arithmetic"))
    chosen = stealthiest_payload(policy, task, 1, window=4, prompts=4)
    assert len(chosen) == 1
    text = policy.tokenizer.decode(chosen)
    assert not any(c.isdigit() for c in text) and "answer>" not in text
    best = _gate_score(policy, task, chosen)
    others = [drift_payload(policy, task, 1), *[[t] for t in policy.tokenizer("abc=xyz", add_special_tokens=False)["input_ids"]]]
    assert all(best >= _gate_score(policy, task, other) - 1e-6 for other in others)
