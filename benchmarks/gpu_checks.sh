#!/usr/bin/env bash
# The checks and figures that need a GPU, in one run (a lent GPU machine's time is short):
# the CUDA kernels' tests on the device, the fused update's bandwidth, the hash map against
# the CPU's, and a preset with hash tables trained on the GPU against the same on the CPU.
#
#   bash benchmarks/gpu_checks.sh OUT_DIR
#
# On the lent machines of 2026-11 (numba-cuda 0.30.4, numpy 2.5.2) numba-cuda failed to import
# (`np.row_stack` is gone from numpy 2.5): carry a numpy 2.4 wheel and put it first on
# PYTHONPATH, as BENCHMARKS.md ("On a GPU") says.
set -o pipefail
out=${1:?usage: gpu_checks.sh OUT_DIR}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/src NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1 WANDB_MODE=offline
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-/tmp/numba_cache}

echo "== CUDA tests"
python3 -m pytest -q -p no:cacheprovider -W ignore tests/unit/embedding/kernels/test_kernels_cuda.py \
    tests/unit/embedding/test_cuda_hash_index.py tests/unit/units/test_metric_bag.py \
    tests/unit/checkpoint/test_serialization.py 2>&1 | tail -4

echo "== fused update bandwidth"
for optimizer in rowwise_adagrad sgd adam; do
    python3 benchmarks/update_bandwidth.py --optimizer "$optimizer" 2>&1 | tail -4 | tee -a "$out/update_bandwidth.txt"
done

echo "== hash map, GPU against CPU"
python3 benchmarks/hash_table_gpu.py --batches 10 --warmup 10 2>&1 | tee "$out/hash_table_gpu.txt"

echo "== dlrm_criteo_tiny_dynamic on the GPU and on the CPU"
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$out/pip.log" 2>&1 || tail -3 "$out/pip.log"
for device in cuda cpu; do
    (time python3 -m recipes train dlrm_criteo_tiny_dynamic -o "$out/run_$device" trainer.device=$device) \
        > "$out/run_$device.log" 2>&1
    echo "$device: exit $?, $(grep real "$out/run_$device.log")"
    python3 -m recipes export-tables "$out/run_$device" -o "$out/export_$device" > /dev/null 2>&1
done
python3 benchmarks/gpu_cpu_hash_runs.py "$out/run_cuda" "$out/run_cpu" "$out/export_cuda" "$out/export_cpu"
