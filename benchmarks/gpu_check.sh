#!/usr/bin/env bash
# One run on a lent GPU node (issue 16, item 8); under 5 minutes.
#
#   bash benchmarks/gpu_check.sh            # from the repository root, on the GPU machine
#   OUT=/some/dir bash benchmarks/gpu_check.sh
#   DRY_RUN=1 PYTHON=.venv/bin/python bash benchmarks/gpu_check.sh   # CPU: no install, no
#       GPU tests, every helper with --dry-run (what tests/unit/test_gpu_check.py runs)
#
# 1. a venv that sees the machine's own CuPy/NumPy (--system-site-packages), with the repo
#    installed as `pip install -e '.[gpu,test,bench]'`; the device machine of this
#    workplace reaches no package registry, so wheels carried in ./.whl (see
#    /work/.library/device/README.md) are used when present (--no-index --find-links);
# 2. pytest -m gpu (tests that need a real NVIDIA GPU);
# 3. the checkpoint check with a 1 GiB CuPy state (benchmarks/gpu_check.py checkpoint);
# 4. one exporter scrape over real NVML (gpu_check.py exporter);
# 5. two real CUDA processes co-located through the agent, NVML-sampled busy fraction
#    (gpu_check.py colocate).
# Every part writes JSON under $OUT; $OUT/gpu_check.json sums them up. A part that fails
# is recorded as failed and the others still run. Nothing here changes the GPU's settings.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$(mktemp -d /tmp/m27-gpu-check.XXXXXX)}
PYTHON=${PYTHON:-python3}
VENV=${VENV:-/tmp/m27-gpu-venv}
mkdir -p "$OUT"
cd "$ROOT" || exit 2
export PYTHONUNBUFFERED=1 PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1
export M27_HOME="$OUT/m27home" M27_CONFIG="$OUT/no-m2config" M27_GPUS=nvml
: > "$M27_CONFIG"  # an empty settings file (a missing $M27_CONFIG file is an error)
DRY_RUN=${DRY_RUN:-0}
DRY=()
SIZE=1GiB
if [ "$DRY_RUN" = 1 ]; then
    DRY=(--dry-run)
    SIZE=8MiB
    export M27_GPUS=sim:1
fi
started=$(date +%s)
declare -A status

step() { # step NAME TIMEOUT_S COMMAND...: run it, its output in $OUT/NAME.log, rc kept
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s)"
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    status[$name]=$?
    echo "   rc=${status[$name]} after $(($(date +%s) - started))s"
    tail -n 5 "$OUT/$name.log"
}

# --- 1. install ------------------------------------------------------------------------
install() {
    "$PYTHON" -m venv --system-site-packages "$VENV" || return 1
    local pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
    if [ -d .whl ]; then
        pip+=(--no-index --find-links .whl)
    fi
    # cupy-cuda12x is the [gpu] extra; a machine image may hold another CuPy build
    # (cupy-cuda13x): keep that one rather than fail for want of a registry.
    if "$VENV/bin/python" -c 'import cupy' 2>/dev/null; then
        "${pip[@]}" -e '.[test,bench]' || "${pip[@]}" --no-deps -e .
    else
        "${pip[@]}" -e '.[gpu,test,bench]'
    fi
    "$VENV/bin/python" -c 'import m27, cupy, pynvml; print("m27", m27.__file__, "cupy", cupy.__version__)'
}
# `timeout` runs programs, not shell functions: the function goes to a child bash.
export PYTHON VENV
export -f install
if [ "$DRY_RUN" = 1 ]; then
    status[install]=0
    PY=$PYTHON
else
    step install 150 bash -c install
    PY="$VENV/bin/python"
    [ -x "$PY" ] || PY=$PYTHON
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/nvidia-smi.csv" 2>&1 ||
    echo "no nvidia-smi" >"$OUT/nvidia-smi.csv"

# --- 2-5. the checks -------------------------------------------------------------------
if [ "$DRY_RUN" = 1 ]; then
    status[pytest_gpu]=0
else
    step pytest_gpu 90 "$PY" -m pytest -q -m gpu -p no:cacheprovider \
        --junitxml="$OUT/pytest-gpu.xml" tests/unit
fi
step checkpoint 90 "$PY" benchmarks/gpu_check.py checkpoint --size "$SIZE" "${DRY[@]}"
step exporter 30 "$PY" benchmarks/gpu_check.py exporter "${DRY[@]}"
step colocate 60 "$PY" benchmarks/gpu_check.py colocate --cycles 6 --compute 0.3 --io 0.3 \
    "${DRY[@]}"

# --- summary ---------------------------------------------------------------------------
for name in checkpoint exporter colocate; do
    # the JSON object is the log's last lines (from its first line that is only "{")
    sed -n '/^{$/,$p' "$OUT/$name.log" >"$OUT/$name.json"
done
{
    echo "{"
    echo "  \"seconds\": $(($(date +%s) - started)),"
    for name in install pytest_gpu checkpoint exporter colocate; do
        echo "  \"rc_$name\": ${status[$name]:-null},"
    done
    echo "  \"dry_run\": $([ "$DRY_RUN" = 1 ] && echo true || echo false),"
    echo "  \"gpu\": \"$(tail -n 1 "$OUT/nvidia-smi.csv" | tr -d '"\\')\""
    echo "}"
} >"$OUT/gpu_check.json"
cat "$OUT/gpu_check.json"
for name in install pytest_gpu checkpoint exporter colocate; do
    [ "${status[$name]:-1}" -eq 0 ] || exit 1
done
exit 0
