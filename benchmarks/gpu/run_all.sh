#!/bin/bash
# Everything benchmarks/gpu checks on a GPU machine, in one go (docs/gpu.md):
#   benchmarks/gpu/run_all.sh DIR LOGS           # ENCODER_ARGS=--torch-only: the encoder's steady state alone
# DIR holds what was prepared here: programs/ (prepare.py), conformance/ (conformance.py prepare),
# fusion/ (fusion.py prepare; or subfolders of it, each measured beside the others) and encoder/
# (encoder_layer.py prepare). Builds the RAL with CMake,
# then runs each part under its own time limit, its log written to LOGS/<part>.log.
set -u
dir=$1 logs=$2
mkdir -p "$logs"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$logs/device.log"
cmake -S ral_runtime -B /tmp/ral -DCMAKE_BUILD_TYPE=Release > "$logs/build.log" 2>&1 &&
  cmake --build /tmp/ral -j 16 >> "$logs/build.log" 2>&1 || { tail -30 "$logs/build.log"; exit 1; }
export DISC_RAL_DIR=/tmp/ral PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
run() {  # part, seconds, command...
  local part=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$logs/$part.log" 2>&1
  echo "== $part: exit $? in $((SECONDS - start)) s"
  grep -E "^(device|FAIL|NOT COMPILED|[0-9]+ of [0-9]+)" "$logs/$part.log" | head -40
}
[ -d "$dir/programs" ] && run programs 90 python3 benchmarks/gpu/run_cases.py "$dir/programs"
[ -d "$dir/conformance" ] && run conformance 150 python3 benchmarks/gpu/conformance.py run "$dir/conformance" --jobs 6
if [ -d "$dir/fusion" ]; then  # its subfolders, if any: versions of the compiler measured side by side
  versions=$(find "$dir/fusion" -mindepth 1 -maxdepth 1 -type d | sort)
  run fusion 120 python3 benchmarks/gpu/fusion.py run ${versions:-"$dir/fusion"}; grep -vE "^(device|\{)" "$logs/fusion.log" | tail -14
fi
if [ -d "$dir/encoder" ]; then
  run encoder 150 python3 benchmarks/gpu/encoder_layer.py run "$dir/encoder" ${ENCODER_ARGS:-}; grep -E "^(trace|steady|max)" "$logs/encoder.log"
fi
exit 0
