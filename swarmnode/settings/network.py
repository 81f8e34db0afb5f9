"""Addresses every part of a node agrees on."""

from __future__ import annotations

LOCAL_HOST = "127.0.0.1"  # this machine (or container) only: /health, tests, local swarms
