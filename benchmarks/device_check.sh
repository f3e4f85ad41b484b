#!/usr/bin/env bash
# The checks that need a GPU, in one go, for the rare times a GPU machine is at hand: the CUDA
# capture tests, the capture-overhead benchmark on CUDA (module level with statistics only and
# with full tensors, and op level), the FX fast path tests, and the vLLM capture where this
# llmcheck has one and vLLM is installed. Prints one table, each part's outcome, time and key
# figures; the full output of each part is kept in the logs folder.
#
#     benchmarks/device_check.sh [--logs DIR] [PART ...]
#
# PART: cuda-tests, capture-overhead, fx-fast-path, vllm (default: all, in that order). Each part
# has its own time limit, 8 minutes in all. On a machine without CUDA it still runs: the FX fast
# path tests run on the CPU and each CUDA part is named as skipped, with why. It exits 1 when a
# part that ran failed or ran out of time, else 0. The Python is $PYTHON, else .venv/bin/python,
# else python3; the code is this checkout's src/.
set -uo pipefail
cd "$(dirname "$0")/.."

ALL_PARTS=(cuda-tests capture-overhead fx-fast-path vllm)
# Seconds each part may take: 480 in all, the 8 minutes a GPU machine's check may take.
declare -A LIMIT_S=([cuda-tests]=150 [capture-overhead]=120 [fx-fast-path]=150 [vllm]=60)

logs=""
parts=()
while [ "$#" -gt 0 ]; do
    case "$1" in
        --logs) logs=${2:?--logs needs a folder}; shift 2 ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *)
            if [[ " ${ALL_PARTS[*]} " != *" $1 "* ]]; then
                echo "device_check: error: $1: no such part (give one of: ${ALL_PARTS[*]})" >&2
                exit 2
            fi
            parts+=("$1"); shift ;;
    esac
done
[ "${#parts[@]}" -eq 0 ] && parts=("${ALL_PARTS[@]}")
logs=${logs:-$(mktemp -d "${TMPDIR:-/tmp}/llmcheck_device_check.XXXXXX")}
mkdir -p "$logs"

python=${PYTHON:-}
if [ -z "$python" ]; then
    if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

# What this machine has: the CUDA device torch sees (empty: none), and whether vLLM and an llmcheck
# capture backend for it are installed.
device=$("$python" -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>/dev/null)
torch_version=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "not importable")
vllm_backend=$("$python" -c 'from llmcheck.core.plugins import get_plugins
print(any("vllm" in name.lower() for name in get_plugins().capture_backends()))' 2>/dev/null)
vllm_version=$("$python" -c 'import vllm; print(vllm.__version__)' 2>/dev/null)
# Why the CUDA parts cannot run here (empty: they can).
if [ "$torch_version" = "not importable" ]; then
    no_cuda="torch is not importable by $python (set PYTHON)"
elif [ -z "$device" ]; then
    no_cuda="no CUDA device"
else
    no_cuda=""
fi

rows=()
failed=0

# Run one part: its command under its time limit, the output to its log; the table row says
# what happened (passed, failed with the exit code, or out of time) and the figures it printed.
run_part() {
    local part=$1; shift
    local log="$logs/$part.log" started status elapsed_s outcome
    started=$(date +%s)
    timeout --kill-after=10 "${LIMIT_S[$part]}" "$@" >"$log" 2>&1
    status=$?
    elapsed_s=$(( $(date +%s) - started ))
    case "$status" in
        0) outcome="passed" ;;
        124|137) outcome="out of time (${LIMIT_S[$part]} s)"; failed=1 ;;
        *) outcome="failed (exit $status)"; failed=1 ;;
    esac
    rows+=("$part|$outcome|${elapsed_s} s|$(figures "$part" "$log")")
}

skip_part() {
    rows+=("$1|skipped: $2|-|-")
}

# The figures a reader looks for in a part's log: pytest's closing counts, the benchmark's ratios.
figures() {
    local part=$1 log=$2
    case "$part" in
        capture-overhead)
            awk '/^plain forward:/ { printf "plain %s %s; ", $3, $4 }
                 /^(module|op), / { split($0, cells, /  +/); printf "%s %s (to disk %s); ", cells[1], $(NF-4), $(NF-2) }' "$log" \
                | sed 's/; $//' ;;
        *)
            grep -E '^(=+ )?[0-9]+ (passed|failed|skipped|error)' "$log" | tail -1 | sed -E 's/^=+ //; s/ =+$//' ;;
    esac
}

for part in "${parts[@]}"; do
    case "$part" in
        cuda-tests)
            if [ -n "$no_cuda" ]; then skip_part "$part" "$no_cuda"; continue; fi
            run_part "$part" "$python" -m pytest -q -p no:cacheprovider tests/test_torch_capture_cuda.py ;;
        capture-overhead)
            if [ -n "$no_cuda" ]; then skip_part "$part" "$no_cuda"; continue; fi
            run_part "$part" "$python" benchmarks/capture_overhead.py --device cuda --rounds 3 ;;
        fx-fast-path)
            # The FX fast path runs on the CPU in this llmcheck; on a GPU machine it runs there too.
            run_part "$part" "$python" -m pytest -q -p no:cacheprovider tests/test_fx_capture_fast.py ;;
        vllm)
            if [ "$vllm_backend" != "True" ]; then skip_part "$part" "no vLLM backend in this llmcheck"; continue; fi
            if [ -z "$vllm_version" ]; then skip_part "$part" "vLLM is not installed"; continue; fi
            if [ -n "$no_cuda" ]; then skip_part "$part" "$no_cuda"; continue; fi
            vllm_tests=(tests/test_vllm*.py)
            if [ ! -e "${vllm_tests[0]}" ]; then skip_part "$part" "no tests/test_vllm*.py"; continue; fi
            run_part "$part" "$python" -m pytest -q -p no:cacheprovider "${vllm_tests[@]}" ;;
    esac
done

echo
echo "llmcheck device check on ${device:-no CUDA device (CPU only)}; torch $torch_version${vllm_version:+, vLLM $vllm_version}"
printf '%-18s %-42s %-8s %s\n' part outcome time figures
for row in "${rows[@]}"; do
    IFS='|' read -r part outcome elapsed figures_text <<<"$row"
    printf '%-18s %-42s %-8s %s\n' "$part" "$outcome" "$elapsed" "$figures_text"
done
echo "logs: $logs"
exit "$failed"
