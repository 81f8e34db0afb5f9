"""Prometheus metrics of a running node, served at GET /metrics beside /health.

Scraped values are read from the node when Prometheus asks (a custom collector over a
snapshot callable), so nothing runs on the round's path: the latest round's numbers as
gauges, and the node's running totals as counters. Names carry the `swarmnode_` prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from swarmnode.ops.lines import RoundRecord, round_metrics

ROUND_GAUGES = round_metrics("gauge")  # RoundRecord field -> help text, declared with the field
COUNTERS = {  # snapshot key -> help text
    "published": "completions this node published",
    "consumed": "peers' completions this node trained on",
    "rejected": "bad batches counted against peers",
}


class NodeCollector(Collector):
    """Turns `snapshot()` (last RoundRecord or None, last eval accuracy, running totals) into
    Prometheus metric families."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        now = self.snapshot()
        record: RoundRecord | None = now.get("last_round")
        if record is not None:
            for name, about in ROUND_GAUGES.items():
                value = getattr(record, name)
                if value is not None:
                    yield GaugeMetricFamily(f"swarmnode_{name}", about, value=float(value))
            yield GaugeMetricFamily(
                "swarmnode_round_seconds", "wall time of the last round", value=record.timings.get("round_s", 0.0)
            )
        if now.get("eval_acc") is not None:
            yield GaugeMetricFamily("swarmnode_eval_acc", "held-out accuracy at the last evaluation",
                                    value=float(now["eval_acc"]))
        for name, about in COUNTERS.items():
            yield CounterMetricFamily(f"swarmnode_{name}", about, value=float(now.get(name, 0)))
        yield GaugeMetricFamily(
            "swarmnode_claimed_used", "this node's completions that live peers claim to have trained on "
            "(their heartbeats' claims, each at most what this node published)", value=float(now.get("claimed_used", 0)),
        )
        yield GaugeMetricFamily("swarmnode_claimants", "live peers claiming to have trained on this node's completions",
                                value=float(now.get("claimants", 0)))
        if now.get("info"):
            info = InfoMetricFamily("swarmnode_node", "who this node is: its peer id, model and run")
            info.add_metric([], {key: str(value) for key, value in now["info"].items()})
            yield info


def metrics_page(snapshot: Callable[[], dict[str, Any]]) -> Callable[[], bytes]:
    """The /metrics body, in Prometheus' text format, computed at each scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(snapshot))
    return lambda: generate_latest(registry)
