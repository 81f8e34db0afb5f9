"""The swarm over hivemind: identity, signed DHT records, peer-to-peer payloads, heartbeats."""
