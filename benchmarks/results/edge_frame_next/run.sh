# Run in the twenty-first session (call1/, neither patch kept; README.md): two follow-ups of the edge-frame backward
# (../edge_frame_backward/, 88c2930), one device call, carry .carry/reference-tests.tar.xz,
# about 7 minutes:
#   OUT=... bash benchmarks/results/edge_frame_next/run.sh
# - new (contract3.patch): the {M, K} entries are built without K's u component, which
#   tp_backward_edge no longer reads (one multiply-add of four per coefficient and edge in
#   chunk_contract_sh / chunk_contract_dense; the values the tasks read are the same bits).
# - both (+ sparse_off.patch): the layers with scalar inputs or outputs run the {M, K}
#   backward instead of the compile-time Wigner 3j one (sparse_backward), which won against
#   the four-component {M, K} and was not measured against the edge frame's.
# If either wins: the GPU test suite before it lands (sparse_off changes those layers' sums).
set -uo pipefail
DIR=benchmarks/results/edge_frame_next
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
BASE=HEAD OUT=$OUT/ab ROUNDS=${ROUNDS:-1} REPEATS=5 MICRO_SIZES="32000 864" \
  PATCH=$DIR/contract3.patch VARIANTS="both=$DIR/sparse_off.patch" \
  timeout ${AB_S:-560} bash scripts/gpu_ab.sh
echo "elapsed $SECONDS s"
cp "$OUT"/ab/ab_summary.md "$OUT"/ 2>/dev/null
tar -czf "$OUT"/ab.tar.gz -C "$OUT" ab && rm -rf "$OUT"/ab
