"""The prompt is protocol: only prompt ids travel, so a receiver must rebuild the prompt its
sender answered, exactly, from the problem id alone.

The words are the task's (its system prompt, the problem's question), which the run id covers
through the task's fingerprint; the token ids are each model's own (its chat template, when
the run uses them). Every place that needs a prompt, for its own groups, a peer's, or an
evaluation, builds it here.
"""

from __future__ import annotations

from typing import Protocol

from swarmnode.tasks.base import Problem, Task


class PromptEncoder(Protocol):
    """A model's way of turning prompt text into its token ids (swarmnode.model.policy.Policy)."""

    def encode_prompt(self, system: str, question: str) -> list[int]: ...


def prompt_text(task: Task, problem: Problem) -> tuple[str, str]:
    """(system, user) text of a problem's prompt."""
    return task.system_prompt, problem.question


def build_prompt(task: Task, problem: Problem, encoder: PromptEncoder) -> list[int]:
    """The token ids of a problem's prompt for the model behind `encoder`."""
    system, user = prompt_text(task, problem)
    return encoder.encode_prompt(system, user)
