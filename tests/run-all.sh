#!/usr/bin/env bash
# Install everything the tests need on a fresh Debian machine, bring the local Slurm cluster up unless it
# is already, run every test, and take the cluster down again if this run brought it up. The README's test
# command and CI's .ci/run both call this script; extra arguments go to pytest.
#
# Runs share a cluster through locks beside its state folder (HPCDL_SLURM_STATE): one run at a time finds
# it up or starts it (STATE.start.lock); each holds STATE.lock shared while it tests; a run that found the
# cluster up never takes it down; the run that started it takes STATE.lock exclusively at exit, so it waits
# for every other run using the cluster, then takes it down.
# HPCDL_RUN_ALL_DRY=1: install nothing, let the file $HPCDL_SLURM_STATE/dry-run-up stand for the
# cluster, and run the arguments as a command in place of pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

STATE=${HPCDL_SLURM_STATE:-/var/tmp/hpcdl-slurm}
DRY=${HPCDL_RUN_ALL_DRY:-}
say() { printf '[tests/run-all.sh] %s\n' "$*" >&2; }

cluster() {  # cluster up|down|running; the lock files closed, so that no daemon holds a lock
  if [ -z "$DRY" ]; then bash slurm/cluster.sh "$1" 8>&- 9>&-; return; fi
  case $1 in
    up) mkdir -p "$STATE" && touch "$STATE/dry-run-up" ;;
    down) rm -f "$STATE/dry-run-up" ;;
    running) [ -e "$STATE/dry-run-up" ] ;;
  esac
}

take_down() {
  say "waiting for the other runs using the cluster at $STATE to end"
  flock -x 9
  cluster down
  say "took the cluster at $STATE down"
}

exec 8>>"${STATE%/}.start.lock" 9>>"${STATE%/}.lock"
flock -x 8                                        # one run at a time finds the cluster up or starts it
flock -s 9                                        # (waits while a run takes it down)
if cluster running; then
  say "using the cluster at $STATE that was already up; this run leaves it up"
else
  say "starting the cluster at $STATE; this run takes it down at exit"
  cluster up                                      # installs slurm, slurmdbd, munge, mariadb, Open MPI if missing
  trap take_down EXIT
fi
exec 8>&-

if [ -n "$DRY" ]; then
  test_command=("$@")
else
  if [ -z "${VIRTUAL_ENV:-}" ]; then              # a virtual environment of its own: packages the machine
    python3 -m venv .venv                         # came with (awscli pins botocore) cannot clash with the tests'
    . .venv/bin/activate
  fi
  if ! command -v chromium >/dev/null 2>&1; then  # the experiment page's tests open it in a real browser
    say "installing chromium"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends chromium >/dev/null
  fi
  python3 -m pip install -q torch==2.13.0        # the CPU build that lies on disk; install it first
  python3 -m pip install -q -e '.[test,mpi]'     # mpi4py finds Debian's Open MPI; moto serves S3 on loopback
  export HPCDL_REQUIRE_SLURM=1                    # tests against the cluster fail, never skip, here
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1   # CI runs as root
  test_command=(python3 -m pytest -q -ra --durations=25 "$@")
fi

set +e
"${test_command[@]}" 9>&-                         # what the tests leave running must not hold the lock
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  status=1
fi
exit "$status"
