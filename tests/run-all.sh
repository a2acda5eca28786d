#!/usr/bin/env bash
# Install everything the tests need on a fresh Debian machine, bring the local Slurm cluster up,
# run every test, and take the cluster down again. The README's test command and CI's .ci/run
# both call this script; extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

bash slurm/cluster.sh up                          # installs slurm, slurmdbd, munge, mariadb, Open MPI if missing
if [ -z "${VIRTUAL_ENV:-}" ]; then                # a virtual environment of its own: packages the machine
  python3 -m venv .venv                           # came with (awscli pins botocore) cannot clash with the tests'
  . .venv/bin/activate
fi
trap 'bash slurm/cluster.sh down' EXIT
python3 -m pip install -q torch==2.13.0          # the CPU build that lies on disk; install it first
python3 -m pip install -q -e '.[test,mpi]'       # mpi4py finds Debian's Open MPI; moto serves S3 on loopback
export HPCDL_REQUIRE_SLURM=1                      # tests against the cluster fail, never skip, here
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1   # CI runs as root

set +e
python3 -m pytest -q -ra --durations=25 "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  status=1
fi
exit "$status"
