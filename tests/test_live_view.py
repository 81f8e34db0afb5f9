"""What a volunteer watches: the live line (what it says, how long is left) and `status`."""

from __future__ import annotations

import dataclasses
import io

import pytest
from rich.console import Console
from typer.testing import CliRunner

from swarmnode import cli
from swarmnode.cli import app
from swarmnode.ops.lines import RoundRecord
from swarmnode.ops.metrics import LiveView, format_duration
from swarmnode.ops.status import render_table, sparkline
from swarmnode.protocol.records import EVAL_HISTORY, Heartbeat, PeerRow, RecordError
from swarmnode.swarm.hivemind.status import shown_state


def _record(round_: int, round_s: float) -> RoundRecord:
    return RoundRecord(
        round=round_, peer_id="Qm", reward_mean=0.5, peer_reward_mean=None, own_samples=64, peer_samples=32,
        peers=1, gated=0, below_bar=0, peer_weight_scale=None, filtered=0, filtered_frac=0.0, weight_mean=1.0,
        weight_max=2.0, truncated_frac=0.0, divergence_mean=0.0, loss=0.0, grad_norm=0.0, wire_bytes=0,
        wire_tokens=0, rejected=0, peer_age_s=None, peer_lag=None, tokens_per_s=0.0, timings={"round_s": round_s},
    )


def test_the_live_line_ends_with_the_time_left_from_the_wall_time_between_rounds():
    out, now = io.StringIO(), [100.0]
    view = LiveView(Console(file=out, width=120), clock=lambda: now[0])
    view.round(_record(0, round_s=4.0), total_rounds=11)  # the first round: its own time, 10 left
    now[0] += 10.0  # evaluations and checkpoints count: the wall time between rounds, not round_s
    view.round(_record(1, round_s=4.0), total_rounds=11)
    first, second = out.getvalue().splitlines()
    assert first.startswith("round 1/11 ") and first.endswith("eta 40s")
    assert second.endswith(f"eta {format_duration(9 * (4.0 + 0.2 * (10.0 - 4.0)))}")
    assert len(second) <= 80, second
    now[0] += 10.0
    view.round(_record(10, round_s=4.0), total_rounds=11)
    assert out.getvalue().splitlines()[-1].endswith("eta 0s"), "the last round: nothing left"


def test_a_busy_round_line_of_a_long_run_fits_80_columns():
    out = io.StringIO()
    view = LiveView(Console(file=out, width=200), clock=lambda: 0.0)
    busy = dataclasses.replace(_record(998, round_s=12.3), own_samples=128, peer_samples=128, filtered=12,
                               reward_mean=-0.123, weight_mean=0.987)
    view.round(busy, total_rounds=1000)
    line = out.getvalue().strip()
    assert len(line) <= 80 and " filt 12 " in line and " 12s " in line, line
    view.round(_record(5, round_s=0.5), total_rounds=1000)
    assert " filt " not in out.getvalue().splitlines()[-1], "no filter count when nothing was filtered"


def test_durations_read_at_a_glance():
    assert [format_duration(s) for s in (0.4, 45, 192, 3600 * 2 + 300)] == ["0s", "45s", "3m12s", "2h05m"]


def test_status_draws_each_peer_s_last_evaluations_within_80_columns():
    assert sparkline([0.5, 0.55, 0.6]) == "▁▅█" and sparkline([0.6]) == ""
    assert sparkline([0.600, 0.604, 0.602]) == "▁▁▁", "a change under a point is not blown up"
    beat = Heartbeat.parse({"peer": "Qm" + "x" * 44, "run": "r" * 16, "time": 1.0, "round": 120, "model": "Qwen/Qwen2.5-3B",
                            "eval_acc": 0.61, "evals": [0.40, 0.47, 0.55, 0.61], "reach": "relayed", "lora": 16})
    out = io.StringIO()
    Console(file=out, width=80).print(render_table([PeerRow(beat, 2.0, "training")]))
    assert "0.610 ▁▃▆█" in out.getvalue(), out.getvalue()
    assert all(len(line) <= 80 for line in out.getvalue().splitlines())
    for bad in ([1.5], [0.5] * (EVAL_HISTORY + 1), ["0.5"]):
        with pytest.raises(RecordError, match="evals"):
            Heartbeat.parse({"peer": "Qm", "run": "r", "time": 1.0, "evals": bad})


def test_status_keeps_every_narrow_column_whole_in_80_columns_for_three_busy_peers():
    """Slow answers, long ages, 4-digit rounds and four evaluations each: the accuracy column
    (the one a volunteer reads) used to be cut at the console's edge."""
    rows = []
    for model, lora in (("tiny", 0), ("tiny", 8), ("tiny-large", 0)):
        beat = Heartbeat.parse({"peer": "Qm" + "x" * 44, "run": "r" * 16, "time": 1.0, "round": 1234, "model": model,
                                "eval_acc": 0.512, "evals": [0.40, 0.45, 0.50, 0.512], "lora": lora})
        rows.append(PeerRow(beat, 123.0, "training", asked=True, answered_ms=12345.0, reached="local"))
    out = io.StringIO()
    Console(file=out, width=80).print(render_table(rows))
    text = out.getvalue()
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "eval_acc" in text and text.count("0.512 ▁▄▇█") == 3 and "LoRA r=8" in text, text


def test_status_counts_the_families_in_80_columns_and_names_each_peer_s_when_wide():
    """Two families: the title says so in 80 columns, and `--wide` names each row's."""
    def rows(families):
        return [
            PeerRow(Heartbeat.parse({"peer": "Qm" + "x" * 44, "run": "r" * 16, "time": 1.0, "round": 1234,
                                     "model": model, "tokenizer": family, "eval_acc": 0.512,
                                     "evals": [0.40, 0.45, 0.50, 0.512]}),
                    123.0, "training", asked=True, answered_ms=12345.0, reached="local")
            for model, family in zip(("tiny", "tiny-llama"), families)
        ]

    def shown(rows_, wide=False):
        out = io.StringIO()
        Console(file=out, width=200 if wide else 80).print(render_table(rows_, wide))
        return out.getvalue()

    families = ("3f2a9c1d0e7b6a55", "b7e1c2d3a4f50617")
    mixed = shown(rows(families))
    assert "2 peer(s) of 2 families" in mixed and all(len(line) <= 80 for line in mixed.splitlines()), mixed
    assert "0.512" in mixed and "3f2a9c1d" not in mixed
    assert "families" not in shown(rows(families[:1] * 2))
    wide = shown(rows(families), wide=True)
    assert "family" in wide and "3f2a9c1d" in wide and "b7e1c2d3" in wide, wide
    for console, whole in ((Console(width=80), False), (cli._status_console(True, Console(width=80)), True)):
        with console.capture() as captured:  # `status --wide` on an 80-column terminal: cut, unless widened
            console.print(render_table(rows(families), True))
        drawn = captured.get()
        assert ("3f2a9c1d" in drawn and "b7e1c2d3" in drawn and "…" not in drawn.replace("…xxxxxxxx", "")) is whole, drawn


def test_status_beside_a_node_says_whether_peers_use_its_rollouts_as_their_claims_capped_at_what_it_published():
    """`status` in a node's run dir: what it published, what the others claim to have trained
    on (a liar claiming a billion counts as at most everything published), and its own count
    of theirs; `--wide` shows both per peer."""
    def heartbeat(peer, **fields):
        return PeerRow(Heartbeat.parse({"peer": peer, "run": "r" * 16, "time": 1.0, **fields}), 3.0, "training")

    me, honest, liar = "Qm" + "a" * 44, "Qm" + "b" * 44, "Qm" + "c" * 44
    rows = [
        heartbeat(me, published=640, consumed=300, used={honest: 300}),
        heartbeat(honest, published=640, consumed=320, used={me: 320}),
        heartbeat(liar, used={me: 10**9}),
    ]
    out = io.StringIO()
    Console(file=out, width=80).print(render_table(rows, me=me))
    said = " ".join(out.getvalue().split())
    assert "published 640 completions, 2 peer(s) claim to have trained on 960 of them" in said, said
    assert "you trained on 300 of your peers' completions" in said
    wide = io.StringIO()
    Console(file=wide, width=250).print(render_table(rows, wide=True, me=me))
    liar_line = next(line for line in wide.getvalue().splitlines() if "…cccccccc" in line)
    assert " 640 " in liar_line and "1000000000" not in liar_line, liar_line
    assert "published" not in " ".join(render_table_text(rows, None).split()), "not beside a node: no such line"


def render_table_text(rows, me):
    out = io.StringIO()
    Console(file=out, width=80).print(render_table(rows, me=me))
    return out.getvalue()


def test_text_shown_to_a_person_is_never_eaten_as_markup(tmp_path):
    """An install hint or a --set line with brackets prints as written, on the terminal and
    in an error line."""
    out = io.StringIO()
    view = LiveView(Console(file=out, width=200))
    view.say("pip install 'swarmnode[wandb]'")
    view.note("--set model.lora.target_modules=[q_proj,v_proj]")
    assert "swarmnode[wandb]" in out.getvalue() and "[q_proj,v_proj]" in out.getvalue()
    result = CliRunner().invoke(app, ["join", "--model", "[org]/name", "--run-dir", str(tmp_path)])
    assert result.exit_code == 2 and "[org]/name" in result.output, result.output  # an error keeps its brackets


def test_a_peer_s_strings_are_shown_as_text_never_as_markup():
    """A model name of '[/x]' raised rich's MarkupError and took `status` down for everyone."""
    row = PeerRow(Heartbeat.parse({"peer": "Qm" + "d" * 44, "run": "r" * 16, "time": 1.0, "model": "[/x][link=evil]m",
                                   "backend": "[bold]hf", "version": "[/]"}), 1.0, "training")
    out = io.StringIO()
    Console(file=out, width=200).print(render_table([row], wide=True))
    assert "[/x][link=evil]m" in out.getvalue() and "[bold]hf" in out.getvalue()


def test_a_peer_that_claims_training_is_shown_training_only_once_it_answered():
    assert shown_state("training", asked=True, answered_ms=12.0) == "training"
    assert shown_state("training", asked=True, answered_ms=None) == "silent"
    assert shown_state("training", asked=False, answered_ms=None) == "unchecked"
    assert shown_state("stale", asked=True, answered_ms=None) == "stale" and shown_state("left", False, None) == "left"
