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

run_pytest() {  # pytest's exit 5 (no test collected) is a failure here too
  local status=0
  python3 -m pytest -q -ra "$@" || status=$?
  if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests ($*): that is a failure here" >&2
    status=1
  fi
  return "$status"
}

if [ "$#" -gt 0 ]; then  # the tests named
  run_pytest "$@"
  exit
fi
# Every test, in two stages. Slurm holds each requeued job ~120 s: the requeue tests wait on the cluster
# while the tests that need no cluster run beside them; then the other Slurm tests. The requeue tests
# preempt every job of the debug partition, so nothing else may use the cluster meanwhile.
requeue_log=$(mktemp)
run_pytest -p no:cacheprovider tests/test_slurm_requeue.py >"$requeue_log" 2>&1 &
requeue=$!
status=0
run_pytest --durations=15 -m "not slurm" || status=1
wait "$requeue" || status=1
echo "--- tests/test_slurm_requeue.py, run beside them:"
cat "$requeue_log"
rm -f "$requeue_log"
run_pytest --durations=15 -m slurm --ignore=tests/test_slurm_requeue.py || status=1
exit "$status"
