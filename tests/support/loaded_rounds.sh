#!/usr/bin/env bash
# Issue 21's check: the ddp, slurm, notebook and browser layers N times in a row (default 3) while another copy
# of the whole suite runs beside them on the same cores.  Both run from clean clones of HEAD (so nothing in this
# checkout is touched) with PYTHONPATH pointing at their clone.  The copy beside runs `-m "not slurm"`: the
# machine holds one SLURM test cluster, and the layers under test need it.  Results: $OUT/rounds.txt.
#
#     bash tests/support/loaded_rounds.sh [ROUNDS] [OUT]
set -uo pipefail
rounds=${1:-3}
out=$(realpath -m "${2:-/tmp/workbench-loaded}")
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
rm -rf "$out" && mkdir -p "$out"
git clone -q "$repo" "$out/layers" && git clone -q "$repo" "$out/beside"
echo "HEAD $(git -C "$repo" rev-parse --short HEAD)" > "$out/rounds.txt"

( cd "$out/beside"; i=0
  while [ ! -e "$out/done" ]; do
    i=$((i+1)); start=$(date +%s)
    PYTHONPATH="$out/beside" timeout 3600 python -m pytest -q -p no:cacheprovider -m "not slurm" > "$out/beside-$i.log" 2>&1
    echo "beside $i rc=$? $(( $(date +%s) - start ))s: $(tail -1 "$out/beside-$i.log")" >> "$out/rounds.txt"
  done ) &
beside=$!

status=0
for i in $(seq 1 "$rounds"); do
  start=$(date +%s); load=$(cut -d' ' -f1-3 /proc/loadavg)
  ( cd "$out/layers"; CI=true PYTHONPATH="$out/layers" timeout 3600 python -m pytest -q -p no:cacheprovider \
      --durations=10 tests/ddp tests/slurm tests/notebooks tests/browser > "$out/layers-$i.log" 2>&1 )
  rc=$?; [ $rc -eq 0 ] || status=1
  echo "layers $i rc=$rc $(( $(date +%s) - start ))s load at start $load: $(grep -E 'passed|failed' "$out/layers-$i.log" | tail -1)" \
      >> "$out/rounds.txt"
done
touch "$out/done"
wait "$beside"
cat "$out/rounds.txt"
exit $status
