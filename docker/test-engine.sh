#!/bin/sh
# What `make test-docker` needs on a Debian machine where it runs as root (CI): Docker's engine
# and debootstrap, installed from Debian's mirror when missing, and dockerd started when no
# engine answers. Not for a machine of yours that runs Docker already: it changes nothing there.
set -eu
if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q docker.io debootstrap >/dev/null \
        || { apt-get update -q >/dev/null && apt-get install -y -q docker.io debootstrap >/dev/null; }
fi
if ! docker info >/dev/null 2>&1; then
    nohup dockerd >/tmp/dockerd.log 2>&1 &
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
fi
docker info >/dev/null
