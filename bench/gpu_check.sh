#!/usr/bin/env bash
# The GPU check: one script a machine with an NVIDIA GPU runs in at most 8 minutes.
#
#   bash bench/gpu_check.sh             # on a GPU: writes bench/results/gpu-<date>.md
#   bash bench/gpu_check.sh --dry-run   # on a CPU: checks the wiring (interpreter, tiny sizes)
#   bash bench/gpu_check.sh --out FILE  # the report elsewhere
#
# Steps (bench/gpu_check.py): the environment digest naming the GPU; the fingerprint kernels'
# bandwidth against a device-to-device copy (bench/kernels.py); examples/tinyllm recorded on
# CUDA with the compiled Triton cross-entropy kernel checked against its torch reference; the
# demo's kernel bug caught with the compiled kernel; a CUDA module capture replayed and
# pruned. Exit status: 0 every step passed, 1 a step failed, 2 bad arguments or no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
dry_run=0
out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) dry_run=1 ;;
        --out) [ $# -ge 2 ] || { echo "gpu_check: --out needs a file" >&2; exit 2; }
               out="$2"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done

python="${PYTHON:-python}"
if [ "$dry_run" = 1 ]; then
    export TRITON_INTERPRET=1
    export CUDA_VISIBLE_DEVICES=""  # the CPU path, even on a machine with a GPU
    out="${out:-${TMPDIR:-/tmp}/fastci-gpu-check-dry-run.md}"
    limit=120
else
    unset TRITON_INTERPRET
    if ! "$python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        echo "gpu_check: no CUDA device visible to torch; run with --dry-run on a CPU" >&2
        exit 2
    fi
    out="${out:-bench/results/gpu-$(date +%Y-%m-%d).md}"
    limit=480
fi
args=(--out "$out")
[ "$dry_run" = 1 ] && args+=(--dry-run)
exec timeout --signal=TERM "$limit" "$python" bench/gpu_check.py "${args[@]}"
