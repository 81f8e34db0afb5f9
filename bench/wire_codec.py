"""Wire figures: bytes per token on a real round of the tiny default, codec throughput (MB/s).

python bench/wire_codec.py
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from swarmnode.assemble import assemble
from swarmnode.protocol import wire
from swarmnode.settings.config import load_config


def real_round_bytes() -> None:
    config = load_config(None, ["node.run_dir=/tmp/swarmnode-bench-wire", "node.eval_size=1", "swarm.enabled=false",
                                "rollout.backend=hf"])
    with assemble(config) as node:
        state = node.produce(0)
    print(
        f"real round (tiny, {config.rollout.prompts_per_round} prompts x "
        f"{config.rollout.group_size}): {state.payload_bytes} B for {state.payload_tokens} tokens "
        f"= {state.payload_bytes / state.payload_tokens:.2f} B/token "
        f"(arrays {wire.BYTES_PER_TOKEN} B/token + header)"
    )


def codec_throughput(repeats: int = 30) -> None:
    rng = np.random.default_rng(0)
    groups = []
    for g in range(2):
        lengths = np.full(12, 256, dtype=np.int64)
        n = int(lengths.sum())
        groups.append(
            wire.CompletionGroup(
                g,
                lengths,
                rng.integers(0, 151_000, n).astype(np.int32),
                (-rng.exponential(1.0, n)).astype(np.float32),
            )
        )
    batch = wire.RolloutBatch(
        "run", "peer", 0, "0" * 64, groups
    )
    data = wire.encode(batch)
    header = len(data) - batch.num_tokens * wire.BYTES_PER_TOKEN
    print(
        f"24 x 256 tokens: {len(data)} B, header+padding {header} B "
        f"({100 * header / (len(data) - header):.2f} % overhead)"
    )
    enc, dec = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        data = wire.encode(batch)
        enc.append(time.perf_counter() - t)
        t = time.perf_counter()
        wire.decode(data)
        dec.append(time.perf_counter() - t)
    mb = len(data) / 1e6
    print(
        f"encode: median {mb / statistics.median(enc):.0f} MB/s; "
        f"decode (with validation): median {mb / statistics.median(dec):.0f} MB/s "
        f"over {repeats} runs of a {mb:.3f} MB message"
    )


if __name__ == "__main__":
    codec_throughput()
    real_round_bytes()
