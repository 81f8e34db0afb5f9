"""Running a node: metrics lines, reporters, exporter, health, Hub push, run dir, status table."""
