# ncu of SevenNet-l3i5's layer-1 backward at 32,000 atoms: HEAD, the working tree (sparse
# columns) and keepzero.patch (zero columns stored as entries of no term). Carry
# .carry/reference-tests.tar.xz.   OUT=... bash benchmarks/results/sparse_columns/run_ncu.sh
set -uo pipefail
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
D=benchmarks/results/sparse_columns
BASE=HEAD NCU=1 NCU_LAYER=1 MICRO_MODELS=7net-l3i5 MICRO_SIZES=32000 OUT=$OUT/ncu \
  VARIANTS="keepzero=$D/keepzero.patch" timeout ${AB_S:-570} bash scripts/gpu_ab.sh
for f in "$OUT"/ncu/ncu_*.txt; do
  echo "== $f"
  grep -E "^ +(Duration|Executed Instructions |Registers Per|L1/TEX Hit Rate|L2 Hit Rate|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy)" "$f" | head -12
  grep -E "stalled_.*per_issue_active.ratio" "$f" | sort -k3 -n -r | head -8
done
echo elapsed $SECONDS
