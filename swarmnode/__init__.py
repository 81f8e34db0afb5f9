"""swarmnode: a peer-to-peer node for decentralised RL post-training with F-TIS."""

__version__ = "0.1.0"
