"""How a node reaches its peers: rollouts (publish, gather) and membership (heartbeats, who is
live), in memory for tests and local runs, or over hivemind (swarm/hivemind/)."""
