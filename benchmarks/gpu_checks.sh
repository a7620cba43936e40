#!/usr/bin/env bash
# The checks and figures that need a GPU (a lent GPU machine's time is short), one line per check or
# figure, every part's full output under OUT_DIR:
#   1. the CUDA kernels' tests on the device (the checkpoint writer's GPU test among them);
#   2. the fused update against the same optimizer in torch ops, for every sparse optimizer;
#   3. DLRM samples/s at batches 16,384 and 65,536, dims 64 and 128, and where a step's time goes;
#   4. every training path on the GPU (benchmarks/gpu_paths.py: fixed and hash tables, pipeline on
#      and off, blocking and async saves, kill -9 and resume, eval, predict, export-tables, runs
#      moved between the GPU and the CPU);
#   5. the hash map on the GPU against the CPU's;
#   6. DIN's and SASRec's training steps against the same models in plain torch (benchmarks/sequence_step.py);
#   7. the DLRM of part 3 with its tables on `host` behind a device cache of a fifth of their rows, against all on
#      the device, in the same run (`ratio_vs_device`, issue 48's goal 0.6; not yet run on a GPU);
#   8. float16 and bfloat16 tables on the GPU (issue 51; not yet run on a GPU): their tests against the CPU path
#      (`half_tests`: the same bits; the CPU kernels of every optimizer compile first, most of its time), then each
#      dtype trained, its AUC beside float32's on the same seed (benchmarks/table_dtype_quality.py):
#      `movielens_small` and the Criteo-format sample on fixed tables (`half_tables`), the sample again on hash
#      tables (`half_hash_tables`).
#
#   bash benchmarks/gpu_checks.sh OUT_DIR
#   PARTS="half_tests half_tables half_hash_tables" bash benchmarks/gpu_checks.sh OUT_DIR   # only these parts
#
# Each part has a time limit of its own, so that one that hangs costs its share only; the limits add
# up to 1,330 s, more than one command on a lent machine may run (10 minutes): run the parts in two
# calls with PARTS (on an H200 on 2026-11-28 parts 1-5 took 53, 19, 64, 65 and 10 s: 214 s in all). On
# the lent machines of 2026-11 (numba-cuda 0.30.4, numpy 2.5.2) numba-cuda failed to import
# (`np.row_stack` is gone from numpy 2.5): carry a numpy 2.4 wheel and put it first on PYTHONPATH,
# as docs/benchmarks.md, "On a GPU", says.
set -o pipefail
out=${1:?usage: gpu_checks.sh OUT_DIR}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/src NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1 WANDB_MODE=offline
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-/tmp/numba_cache}
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$out/pip.log" 2>&1 || tail -3 "$out/pip.log"

part() {  # part NAME SECONDS COMMAND...: the command's output kept whole in OUT_DIR/NAME.txt (if PARTS names it)
    local name=$1 limit=$2 started=$SECONDS
    shift 2
    [[ -z ${PARTS:-} || " $PARTS " == *" $name "* ]] || return 0
    echo "== $name"
    timeout -k 10 "$limit" "$@" > "$out/$name.txt" 2>&1
    local code=$?
    grep -E "$FILTER" "$out/$name.txt"
    echo "-- $name: exit $code, $((SECONDS - started)) s"
}

FILTER='passed|failed|error' part cuda_tests 90 python3 -m pytest -q -p no:cacheprovider -W ignore \
    tests/unit/embedding/kernels/test_kernels_cuda.py tests/unit/embedding/test_cuda_hash_index.py \
    tests/unit/units/test_metric_bag.py tests/unit/checkpoint/test_serialization.py
FILTER='^device|^optimizer=' part update_bandwidth 90 python3 benchmarks/update_bandwidth.py --optimizer all
FILTER='^batch=|^summary|wait' part gpu_throughput 120 python3 benchmarks/gpu_throughput.py \
    --warmup-steps 15 --steps 30 --profile-steps 5 --reader-steps 8
FILTER='^(PASS|FAIL|SKIP)|^gpu_paths' part gpu_paths 130 python3 benchmarks/gpu_paths.py "$out/paths" --device cuda \
    --jobs 8 --budget 120
FILTER='_over_cpu' part hash_table_gpu 30 python3 benchmarks/hash_table_gpu.py --batches 5 --warmup 5
FILTER='ratio_vs_device|^storage=' part tiered_tables 150 python3 benchmarks/gpu_throughput.py --storages device host \
    --batches 65536 --dims 64 --warmup-steps 10 --steps 20 --profile-steps 3 --reader-steps 2
FILTER='ratio_vs_torch' part sequence_step 90 python3 benchmarks/sequence_step.py --device cuda --rounds 10 --steps 3
FILTER='passed|failed|error' part half_tests 240 python3 -m pytest -q -p no:cacheprovider -W ignore \
    tests/unit/embedding/kernels/test_half_precision_rows_cuda.py tests/unit/embedding/test_half_precision_tables_gpu.py
FILTER='auc=|max_abs_gap|failed' part half_tables 240 python3 benchmarks/table_dtype_quality.py \
    --datasets movielens criteo --seeds 0 --overrides trainer.device=cuda
FILTER='auc=|max_abs_gap|failed' part half_hash_tables 150 python3 benchmarks/table_dtype_quality.py \
    --datasets criteo --seeds 0 --overrides trainer.device=cuda model.embeddings.kind=hash
echo "gpu_checks: $SECONDS s"
