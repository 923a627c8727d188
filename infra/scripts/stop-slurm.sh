#!/usr/bin/env bash
# Stop the Slurm daemons that start-slurm.sh started under DIR (default /tmp/m27-slurm).
# munged is left running: it is shared by anything else on the machine that uses munge.
# Jobs still running are killed with their node. Pass --purge to delete DIR as well.
set -euo pipefail

DIR="${1:-/tmp/m27-slurm}"
PURGE="${2:-}"

stop() {
    local pidfile="$1" pid
    [ -s "$pidfile" ] || return 0
    pid="$(cat "$pidfile")"
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
}

if [ -f "$DIR/etc/slurm.conf" ]; then
    export SLURM_CONF="$DIR/etc/slurm.conf"
    scancel --full --quiet --user=root 2>/dev/null || true
fi
stop "$DIR/run/slurmd.pid"
stop "$DIR/run/slurmctld.pid"
rm -f "$DIR/run/slurmd.pid" "$DIR/run/slurmctld.pid"
if [ "$PURGE" = "--purge" ]; then
    rm -rf "$DIR"
fi
