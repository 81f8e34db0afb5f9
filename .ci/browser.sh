#!/bin/sh
# What the swarm page's browser test needs on a Debian machine where CI runs as root: Chromium
# and its WebDriver from Debian's mirror, installed when missing (tests/test_status_page.py).
set -eu
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q chromium chromium-driver >/dev/null \
        || { apt-get update -q >/dev/null && apt-get install -y -q chromium chromium-driver >/dev/null; }
fi
