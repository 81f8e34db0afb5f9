"""The model a node trains: policy, log-probs, checkpoints, tiny models."""
