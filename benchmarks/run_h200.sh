#!/bin/bash
# One device call: the GPU tests and the JPEG benchmark on an H200 machine; everything lands in $OUT.
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_data.py 2>&1 | tee "$OUT/gpu_tests.txt"
(cd benchmarks && timeout "${BENCH_TIMEOUT:-360}" python3 jpeg_resnet50.py --out "$OUT/jpeg_resnet50_h200" "$@") 2>&1 | tee "$OUT/jpeg_resnet50.log"
