# Twenty-second session, call 2 (issue 21): the tail split as it lands, kernels compiled apart
# (SPLIT, conv_backward_split_f32.cu) and in the backward only, against 656e841 (the session's
# first commit, the device's HEAD); the conv microbenchmark of all layers, three models, 864
# and 32,000 atoms, two rounds in the order base, new / new, base. Carries
# .carry/reference-tests.tar.xz, about 9 minutes:
#   OUT=... bash benchmarks/results/tail_split/run_split_kernels.sh
set -uo pipefail
[[ -f .carry/reference-tests.tar.xz ]] && mv .carry/reference-tests.tar.xz .carry/reference.tar.xz
BASE=${BASE:-HEAD} ROUNDS=2 REPEATS=5 MICRO_SIZES="864 32000" OUT=$OUT/ab \
  timeout "${AB_S:-560}" bash scripts/gpu_ab.sh
echo "A/B done at $SECONDS s"
cp "$OUT"/ab/ab_summary.md "$OUT"/ 2>/dev/null
tar -czf "$OUT"/ab.tar.gz -C "$OUT" ab && rm -rf "$OUT"/ab
