#!/usr/bin/env bash
# Install everything the tests need on a fresh Debian machine and run them.
# The README's test command and CI's .ci/run both call this script.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install -q torch==2.13.0          # the CPU build that lies on disk; install it first
python3 -m pip install -q -e '.[test]'

set +e
python3 -m pytest -q -ra "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  status=1
fi
exit "$status"
