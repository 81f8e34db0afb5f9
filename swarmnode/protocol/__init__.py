"""What crosses the wire between nodes: the byte layout, records, run id, batches."""
