#!/usr/bin/env bash
# Install everything the tests need on a fresh Debian machine, bring the local Slurm cluster up,
# run every test, and take the cluster down again. The README's test command and CI's .ci/run
# both call this script; extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install -q torch==2.13.0          # the CPU build that lies on disk; install it first
python3 -m pip install -q -e '.[test]'

bash slurm/cluster.sh up                          # installs slurm-wlm, slurmdbd, munge, mariadb if missing
trap 'bash slurm/cluster.sh down' EXIT
export HPCDL_REQUIRE_SLURM=1                      # tests against the cluster fail, never skip, here

set +e
python3 -m pytest -q -ra "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  status=1
fi
exit "$status"
