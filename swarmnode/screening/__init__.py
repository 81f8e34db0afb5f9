"""Screening peers' samples: what a node lets a peer's sample do to it, judged by what the node
computes itself, in one place.

A peer controls its text and the log pi_gen it reports; it does not control how likely its text
is under *our* model. So before the step, a node scores each peer sample with its own model and
with the starting weights, and decides here:

- the gate (gate.py): a sample with a positive advantage that our model, or the reference,
  finds far less likely than our own samples does not train;
- balanced advantages (screen.py): a group that lost right answers to the gate does not push
  down what its wrong answers share;
- the weight budget and strikes (budget.py): a peer's importance weights average at most 1,
  and log-probs no honest sampler reports are a strike;
- usefulness (usefulness.py): which samples taught us, for the sender's standing, and with
  `node.weight_by_usefulness` how much a peer's samples count;
- the round (screener.py): passes over chunks of groups, at most one strike a peer a round,
  and everything passing as it is when neither the gate nor the budget is on.

Its users import the module they need (the intake the screener, the ledger the usefulness
rule's weight), so importing one rule does not load the model.
"""
