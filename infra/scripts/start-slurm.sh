#!/usr/bin/env bash
# Start a single-node Slurm (munged, slurmctld, slurmd) with two fake GPUs, for m27's
# integration tests and for trying `executor: slurm` on one machine.
#
#   bash infra/scripts/start-slurm.sh [DIR]        (default DIR: /tmp/m27-slurm)
#   export SLURM_CONF=DIR/etc/slurm.conf           (then sbatch, squeue, sinfo work)
#
# Idempotent: installs slurm-wlm and munge with apt-get when they are missing (needs
# root), renders infra/slurm/*.in into DIR/etc, starts only the daemons that are not
# running yet, and returns once `sinfo` shows the node idle (or mixed/allocated: a
# cluster already busy with another session's jobs). Stop it with stop-slurm.sh DIR.
# Environment: M27_SLURM_CPUS (CPUs the node advertises, default 8: small test jobs run
# side by side on a 2-core machine), M27_SLURM_WAIT (seconds to wait, default 60).
set -euo pipefail

DIR="${1:-/tmp/m27-slurm}"
HERE="$(cd "$(dirname "$0")" && pwd)"
TEMPLATES="$HERE/../slurm"
CPUS="${M27_SLURM_CPUS:-8}"
WAIT="${M27_SLURM_WAIT:-60}"

die() { echo "start-slurm: $*" >&2; exit 1; }

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    [ "$(id -u)" = 0 ] || die "slurm-wlm and munge are not installed and this is not root"
    command -v apt-get >/dev/null || die "slurm-wlm and munge are missing and there is no apt-get"
    echo "start-slurm: installing slurm-wlm munge" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null 2>&1 &&
          apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null; } ||
        die "apt-get could not install slurm-wlm munge"
fi
[ "$(id -u)" = 0 ] || die "the daemons run as root here (SlurmUser=root); run as root"

mkdir -p "$DIR"/{etc,state,spool,log,run,dev}
DIR="$(cd "$DIR" && pwd)"
NODE="$(hostname -s)"
export SLURM_CONF="$DIR/etc/slurm.conf"

# --- munge: one per machine, shared with any other Slurm here -------------------------
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    [ -s /etc/munge/munge.key ] || {
        dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
        chown munge:munge /etc/munge/munge.key
        chmod 0400 /etc/munge/munge.key
    }
    install -d -o munge -g munge -m 0755 /run/munge
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do
        munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break
        sleep 0.1
    done
    munge -n </dev/null | unmunge >/dev/null || die "munged did not start"
fi

# --- fake GPUs: NVIDIA's character-device major, so gres hands them out -------------
for i in 0 1; do
    [ -c "$DIR/dev/fakegpu$i" ] || mknod "$DIR/dev/fakegpu$i" c 195 "$i"
done

# --- configuration --------------------------------------------------------------------
MEMORY="$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' | head -1)"
[ -n "$MEMORY" ] || die "cannot read this node's memory from slurmd -C"
HW="CPUs=$CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$MEMORY"
render() {
    sed -e "s|@NODE@|$NODE|g" -e "s|@DIR@|$DIR|g" -e "s|@NODE_HW@|$HW|g" \
        -e "s|@CTLD_PORT@|${M27_SLURMCTLD_PORT:-6817}|g" \
        -e "s|@SLURMD_PORT@|${M27_SLURMD_PORT:-6818}|g" "$1" >"$2.tmp"
    mv "$2.tmp" "$2"
}
render "$TEMPLATES/slurm.conf.in" "$DIR/etc/slurm.conf"
render "$TEMPLATES/gres.conf.in" "$DIR/etc/gres.conf"
render "$TEMPLATES/cgroup.conf.in" "$DIR/etc/cgroup.conf"

# --- daemons: start what is not running ---------------------------------------------
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
# Started here, or already running from this DIR; a daemon that exits at once (its port
# taken by another Slurm on this machine) is an error, not a cluster to use.
start() {
    local daemon="$1" pidfile="$DIR/run/$1.pid"
    alive "$pidfile" && return 0
    "$daemon"
    for _ in $(seq 50); do
        alive "$pidfile" && sleep 0.3 && alive "$pidfile" && return 0
        sleep 0.1
    done
    tail -n 20 "$DIR/log/$daemon.log" >&2 || true
    die "$daemon did not stay up (is another Slurm using its port? see $DIR/log/$daemon.log)"
}
start slurmctld
for _ in $(seq 50); do scontrol ping >/dev/null 2>&1 && break; sleep 0.1; done
start slurmd

deadline=$((SECONDS + WAIT))
while :; do
    state="$(sinfo -h -o %t 2>/dev/null | head -1 || true)"
    case "$state" in
        idle | mix | alloc) break ;;
        down* | drain* | inval*)
            # A node left down by an earlier, unclean stop: tell the controller it is back.
            scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true ;;
    esac
    if [ $SECONDS -ge $deadline ]; then
        tail -n 20 "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" >&2 || true
        die "the node is not idle after ${WAIT}s (sinfo says '${state:-nothing}')"
    fi
    sleep 0.2
done
echo "SLURM_CONF=$SLURM_CONF"
