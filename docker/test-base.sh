#!/bin/sh
# A stand-in for python:3.11-slim-bookworm built from Debian's mirror, for machines that reach
# Debian and PyPI but not Docker Hub (this project's test machines): Debian's own Python 3.11
# with pip and headers, the host's CA bundle for pip (a proxy may sign PyPI's certificates),
# pip allowed to install into the system's Python as in the official image. About 3 minutes.
# Needs root, debootstrap and a running Docker engine.   Usage: docker/test-base.sh [NAME]
set -eu
NAME=${1:-swarmnode-test-base:bookworm}
ROOT=$(mktemp -d)
trap 'rm -rf "$ROOT"' EXIT
debootstrap --variant=minbase --include=python3,python3-pip,python3-dev,python-is-python3,ca-certificates \
    bookworm "$ROOT" >/dev/null
cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/host-ca.crt"
tar -C "$ROOT" -c . | docker import \
    --change 'ENV PIP_CERT=/etc/ssl/certs/host-ca.crt' \
    --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' \
    --change 'CMD ["/bin/bash"]' - "$NAME" >/dev/null
echo "$NAME"
