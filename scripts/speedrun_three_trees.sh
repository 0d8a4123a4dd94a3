#!/bin/bash
# Is a move in the speedrun seed's loss in the code? Three one-GPU seed runs side by side on one
# GPU through each tree's own harness (gpu_run), seed 0, 300 steps, probes every 30 s (the loss
# does not depend on the GPU being shared; the times do):
#   A = an older commit's whole tree, B = this tree with the compile cache, C = this tree without.
# Training losses every 100 steps and each harness's validation loss under $OUT/{A,B,C}/.
#
# Here, before the device call (the older tree, ~2.4 MB, into an ignored folder):
#   mkdir -p .gpu/oldfull && git archive c8e24fc evolve benchmarks configs setup.py pyproject.toml \
#     README.md | tar -x -C .gpu/oldfull && rm -rf .gpu/oldfull/benchmarks/*/results
# On the device (carry .whl data .gpu/oldfull), about 7.5 minutes:
#   bash scripts/speedrun_three_trees.sh
R=$PWD
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/oldsite ./.gpu/oldfull >/dev/null 2>&1
export TIKTOKEN_CACHE_DIR=$R/data/tiktoken
common="--gpus 0 --seeds 0 --steps 300 --no-scaling --probe-every 30 --data $R/data/wikipedia"
mkdir -p "$OUT/A" "$OUT/B" "$OUT/C" /tmp/wA /tmp/wB /tmp/wC
(cd /tmp/wA && OUT=$OUT/A PYTHONPATH=/tmp/oldsite:/tmp/site timeout 530 python3 -m evolve.benchmarks.speedrun.gpu_run $common --work /tmp/wA/data --compile-cache /tmp/wA/cache >"$OUT/A/run.log" 2>&1) &
(cd /tmp/wB && OUT=$OUT/B timeout 530 python3 -m evolve.benchmarks.speedrun.gpu_run $common --work /tmp/wB/data --compile-cache /tmp/wB/cache >"$OUT/B/run.log" 2>&1) &
(cd /tmp/wC && OUT=$OUT/C timeout 530 python3 -m evolve.benchmarks.speedrun.gpu_run $common --work /tmp/wC/data >"$OUT/C/run.log" 2>&1) &
wait
for arm in A B C; do
  echo "== $arm"
  grep -h "train_loss\|^ *0 *ok\|invalid\|Error\|error" "$OUT/$arm/run.log" "$OUT/$arm"/logs/seed-0.txt 2>/dev/null | grep -v RunRecord | head -20
  tail -n 3 "$OUT/$arm/run.log"
done
