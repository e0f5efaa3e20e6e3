#!/usr/bin/env bash
# The class matrix: the tests marked cpu_class under every bfloat16 class this CPU reaches
# (its own, then each lower one through oneDNN's ISA cap; AMX too where the CPU has it), one
# log per setting in OUTDIR (default: a temporary directory), and a summary line per setting.
# Usage: bash ci/class_matrix.sh [OUTDIR]
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$(mktemp -d)}"
mkdir -p "$OUT"
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
has() { [[ " $flags " == *" $1 "* ]]; }
settings=("default")
if has amx_bf16; then settings+=("MXAMP_AMX=0"); fi
if has avx512_bf16; then settings+=("DNNL_MAX_CPU_ISA=AVX512_CORE_BF16"); fi
if has avx512f && has avx512bw && has avx512vl && has avx512dq; then
  settings+=("DNNL_MAX_CPU_ISA=AVX512_CORE" "DNNL_MAX_CPU_ISA=AVX2")
fi
status=0
{
  echo "# cpu_class tests under every class this CPU reaches ($(date -u +%Y-%m-%dT%H:%MZ), commit $(git -C "$ROOT" rev-parse --short HEAD))"
  grep -m1 '^model name' /proc/cpuinfo
  echo "vector flags: $(grep -o 'avx512[a-z_0-9]*\|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
} > "$OUT/summary.txt"
for setting in "${settings[@]}"; do
  log="$OUT/cpu_class-${setting//[=\/]/-}.log"
  if [ "$setting" = default ]; then
    bash "$ROOT/ci/test.sh" -m cpu_class -rfEs > "$log" 2>&1 || status=1
  else
    env "$setting" bash "$ROOT/ci/test.sh" -m cpu_class -rfEs > "$log" 2>&1 || status=1
  fi
  echo "$setting: $(tail -1 "$log")" | tee -a "$OUT/summary.txt"
done
exit $status
