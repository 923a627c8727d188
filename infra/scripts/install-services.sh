#!/usr/bin/env bash
# Install the real services the integration tests start on localhost (Debian/Ubuntu, root):
# Prometheus, Slurm (slurm-wlm, munge), PostgreSQL, GROMACS (the `gmx` binary) and LAMMPS
# (`lmp`), and the
# C compiler that builds m27's checkpoint hasher at install (its test fails under CI=true
# without it).
# Idempotent: installs only what is missing. CI runs it before `make test`.
#   sudo infra/scripts/install-services.sh
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
    echo "install-services.sh: run as root (sudo $0)" >&2
    exit 1
fi

missing=()
# Prometheus 2.x and promtool (exporter issue: rules, boards, integration test).
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
    missing+=(prometheus)
fi

# Slurm and munge (Slurm issue: a real single-node cluster with fake GPU gres).
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
    missing+=(slurm-wlm munge)
fi
# PostgreSQL (lab-scale issue: a real `prefect server` on PostgreSQL).
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
    missing+=(postgresql)
fi

# GROMACS (real MD engines issue: the example and the checkpoint/resume tests run `gmx`;
# with CI=true those tests fail, not skip, without it).
if ! command -v gmx >/dev/null 2>&1; then
    missing+=(gromacs)
fi

# LAMMPS (its restart-file convention and resume are tested with a real `lmp`;
# with CI=true that test fails, not skips, without it).
if ! command -v lmp >/dev/null 2>&1; then
    missing+=(lammps)
fi

# CP2K (its restart files are captured and resumed from with a real `cp2k`; with CI=true
# that test fails, not skips, without it).
if ! command -v cp2k >/dev/null 2>&1; then
    missing+=(cp2k)
fi

# Open MPI's mpirun (a GPU step's MPI ranks are kept to its share of the cores; tested with
# the real launcher, with CI=true that test fails, not skips, without it).
if ! command -v mpirun >/dev/null 2>&1; then
    missing+=(openmpi-bin)
fi

# A C compiler: `pip install` builds csrc/spans.c (m27.checkpoint._spans) with it.
if ! command -v cc >/dev/null 2>&1; then
    missing+=(gcc libc6-dev)
fi

if [ "${#missing[@]}" -eq 0 ]; then
    echo "install-services.sh: nothing to install"
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
# The package list may be stale on a fresh machine; refresh it once if the install fails.
if ! apt-get install -y --no-install-recommends "${missing[@]}"; then
    apt-get update
    apt-get install -y --no-install-recommends "${missing[@]}"
fi
# Debian starts nothing under policy-rc.d in containers, but a full system would start the
# packaged Prometheus on :9090; the tests start their own on a free port either way.
prometheus --version 2>&1 | head -1
slurmctld -V
ls /usr/lib/postgresql/
gmx --version 2>/dev/null | grep -m1 'GROMACS version' || true
lmp -h 2>/dev/null | grep -m1 'Large-scale Atomic' || true
