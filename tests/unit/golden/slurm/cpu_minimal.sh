#!/bin/bash
#SBATCH --job-name=m27.md-20240501-1.simulate
#SBATCH --output=/home/u/.m27/runs/md-20240501-1/simulate.slurm/attempt-1/stdout
#SBATCH --error=/home/u/.m27/runs/md-20240501-1/simulate.slurm/attempt-1/stderr
#SBATCH --open-mode=append
#SBATCH --chdir=/home/u/md
#SBATCH --requeue
#SBATCH --signal=B:USR1@90
# m27 run md-20240501-1, step simulate, attempt 1: written by m27.executors.slurm
# USR1 (sent by Slurm before the time limit) and TERM (scancel, preemption) are
# passed on to the step, which saves a checkpoint and exits; after USR1 the job
# requeues itself and the next start resumes from the newest valid checkpoint.
set -u
m27_dir=/home/u/.m27/runs/md-20240501-1/simulate.slurm/attempt-1
m27_child=''
m27_usr1=0
m27_pass() {
    if [ -n "$m27_child" ]; then kill -s "$1" "$m27_child" 2>/dev/null || true; fi
}
trap 'm27_usr1=1; m27_pass USR1' USR1
trap 'm27_pass TERM' TERM
m27_resume="$(/opt/m27/bin/python -m m27.executors.slurm._resume "${M27_CHECKPOINT_DIR:-}" "${M27_RESUME_FROM:-}")" || m27_resume="${M27_RESUME_FROM:-}"
if [ -n "$m27_resume" ]; then export M27_RESUME_FROM="$m27_resume"; else unset M27_RESUME_FROM; fi
export M27_SLURM_JOB_ID="${SLURM_JOB_ID:-}"
export CUDA_VISIBLE_DEVICES=''
printf '%s\t%s\t%s\t%s\n' "${SLURM_RESTART_COUNT:-0}" "$(hostname)" "${CUDA_VISIBLE_DEVICES-}" "$m27_resume" >>"$m27_dir/starts"
python3 sim.py --steps 10 &
m27_child=$!
# wait returns early when a trapped signal arrives: wait again until the step ends.
while :; do
    wait "$m27_child"
    m27_rc=$?
    kill -0 "$m27_child" 2>/dev/null || break
done
if [ "$m27_usr1" = 1 ] && [ "$m27_rc" != 0 ] && [ "${SLURM_RESTART_COUNT:-0}" -lt 20 ]; then
    echo "m27: step stopped for the time limit (exit $m27_rc); requeueing job $SLURM_JOB_ID" >&2
    scontrol requeue "$SLURM_JOB_ID" && exit 0
fi
exit "$m27_rc"
