"""Research and attack kits that run against the node, not part of it: the ablation of
heterogeneity settings (ablation.py), content-poisoning peers (poison.py) and peers that lie
about liveness (adversary.py). The node never imports this package; bench/ and tests/ do."""
