#!/usr/bin/env bash
# One GPU session's runs, in order of importance, each logged to $RES/<name>.log (docs/gpu.md has
# the results and what each shows). Run from the checkout on a CUDA machine with vLLM importable:
#   RES=~/gpu_results setsid nohup bash load/gpu_session.sh > ~/gpu_results/session.log 2>&1 &
# STEPS picks a subset (default: what the last session left unrun, in order of importance).
# Another vLLM (a second bundle assembled under ~/parts023): the same steps with
#   PYTHONPATH=$HOME/parts023/site:$PWD RES=~/gpu_results/v023 STEPS=tests-selfdraft-async bash load/gpu_session.sh
# Never two engines at once: a second engine starting while the first exits fails vLLM's memory profiling.
# Polling: issue the next device call as soon as one returns (a machine idle 30 s is handed back,
# and the run on it with it); the benchmarks write their tables as they go: tar them to $OUT in every
# poll (eleventh session: the machine was taken mid-run, nothing had come back), and begin every poll with
# `test -d ~/gpu_results || exit 3`: a poll that sleeps on a fresh, bare machine spends its sleep on nothing
# (thirteenth session: 9 minutes).
set -u
RES=${RES:-$HOME/gpu_results}
STEPS=${STEPS:-"bench-paired bench-mixed-long bench-serve"}
CONTROLLER=${CONTROLLER:-"{}"}  # bench-probe: JSON of controller settings, e.g. {"step_max_patience": 2}
mkdir -p "$RES"
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 PHASESPEC_ENGINE__CACHE_DIR=${PHASESPEC_ENGINE__CACHE_DIR:-$HOME/.cache/phasespec}
# CUDA graphs and bf16 as served on GPUs; a small memory share: the tests run two engines in turn.
GPU='"--no-enforce-eager", "--dtype", "bfloat16", "--gpu-memory-utilization", "0.3"'
FDO='"--compilation-config", "{\"cudagraph_mode\": \"FULL_DECODE_ONLY\"}"'
NGRAM_GPU='"--speculative-config", "{\"method\": \"ngram_gpu\", \"num_speculative_tokens\": 3, \"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2}"'
POLICIES=0:0,1:1,2:2,3:3,1:2,adaptive,1:1=aa
TESTS="tests/test_self_draft.py tests/test_depth_hook.py tests/test_phase_server.py tests/test_api.py"

step() {
  local name=$1; shift
  echo "[gpu] $(date +%T) $name: $*"
  "$@" > "$RES/$name.log" 2>&1
  echo "[gpu] $(date +%T) $name exit $?"
}

for s in $STEPS; do
  case $s in
  tests-selfdraft-async)  # the model drafter, async scheduling, vLLM's default graphs (FULL_AND_PIECEWISE)
    PHASESPEC_ENGINE__DRAFTER=self-draft PHASESPEC_VLLM_ARGS="[$GPU, \"--async-scheduling\"]" \
      step "$s" python3 -m pytest -p no:cacheprovider -rA $TESTS ;;
  bench-selfdraft-async)
    PHASESPEC_ENGINE__DRAFTER=self-draft PHASESPEC_VLLM_ARGS="[$GPU, \"--async-scheduling\"]" \
      step "$s" python3 -m load.bench_policies --concurrency 1,4,16,64 --reps 3 --prompts 8 \
      --requests-per-slot 3 --policies "$POLICIES" --out "$RES/$s" ;;
  bench-mixed)  # copy requests (high acceptance) alternating with open questions (low)
    PHASESPEC_ENGINE__DRAFTER=self-draft PHASESPEC_VLLM_ARGS="[$GPU, \"--async-scheduling\"]" \
      step "$s" python3 -m load.bench_policies --workload mixed --concurrency 4,16 --reps 3 --prompts 8 \
      --requests-per-slot 3 --policies 0:0,1:1,2:2,3:3,1:3,adaptive,1:1=aa --out "$RES/$s" ;;
  bench-c16-64)  # a second, shorter policy run where adaptive lost: none, fixed-1, adaptive, the A/A
    PHASESPEC_ENGINE__DRAFTER=self-draft PHASESPEC_VLLM_ARGS="[$GPU, \"--async-scheduling\"]" \
      step "$s" python3 -m load.bench_policies --concurrency 16,64 --reps 2 --prompts 8 \
      --requests-per-slot 3 --policies 0:0,1:1,adaptive,1:1=aa --out "$RES/$s" ;;
  bench-long-cells)  # fewer policies, longer cells: a cell of 3 requests per slot is 2-4 s, shorter than the
    # host's swings (tenth session: the A/A 0.77-1.39x in single repetitions)
    PHASESPEC_ENGINE__DRAFTER=self-draft PHASESPEC_VLLM_ARGS="[$GPU, \"--async-scheduling\"]" \
      step "$s" python3 -m load.bench_policies --concurrency ${CONC:-16,64} --reps ${REPS:-3} --prompts 8 \
      --requests-per-slot ${RPS:-12} --policies 0:0,1:1,adaptive,adaptive=noexp,1:1=aa \
      --arm 'noexp={"explore_share": 0}' --out "$RES/$s" ;;
  bench-mixed-long)  # the mixed workload at c=16 (adaptive 0.81x fixed-1 in the tenth session), cells twice as long
    PHASESPEC_ENGINE__DRAFTER=self-draft PHASESPEC_VLLM_ARGS="[$GPU, \"--async-scheduling\"]" \
      step "$s" python3 -m load.bench_policies --workload mixed --concurrency 16 --reps ${REPS:-4} --prompts 8 \
      --requests-per-slot 6 --policies 0:0,1:1,3:3,adaptive,1:1=aa --out "$RES/$s" ;;
  tests-lookahead)  # a window drafted for by the step before it, and an arrival drafted for at its window's
    # depth, under async scheduling
    PHASESPEC_ENGINE__DRAFTER=self-draft PHASESPEC_VLLM_ARGS="[$GPU, \"--async-scheduling\"]" \
      step "$s" python3 -m pytest -p no:cacheprovider -rA tests/test_self_draft.py \
      -k "adaptive_takes_one_depth_per_step or arriving_adaptive_request" ;;
  bench-long-reasoning)  # 160 thinking tokens, not 48: the budget hold (16 tokens, then the end string) an eighth
    # of each response instead of a third, as in real reasoning; is adaptive's c=16 loss the held waves?
    PHASESPEC_ENGINE__DRAFTER=self-draft PHASESPEC_VLLM_ARGS="[$GPU, \"--async-scheduling\"]" \
      step "$s" python3 -m load.bench_policies --concurrency 16 --reps 3 --prompts 8 --reasoning-budget 160 \
      --requests-per-slot 2 --policies 0:0,1:1,adaptive,1:1=aa --out "$RES/$s" ;;
  bench-selfdraft-fdo)  # mixed depths under FULL_DECODE_ONLY (the user's graph mode): uniform K (fixed-3) is the
    # only decode batch vLLM graphs FULL; ms per engine step by policy in cells.csv
    PHASESPEC_ENGINE__DRAFTER=self-draft PHASESPEC_VLLM_ARGS="[$GPU, \"--async-scheduling\", $FDO]" \
      step "$s" python3 -m load.bench_policies --concurrency 1,16 --reps 2 --prompts 8 \
      --policies 0:0,1:1,3:3,1:3,adaptive --out "$RES/$s" ;;
  bench-selfdraft-fap)  # the same run under vLLM's default FULL_AND_PIECEWISE, in the same machine's hold
    PHASESPEC_ENGINE__DRAFTER=self-draft PHASESPEC_VLLM_ARGS="[$GPU, \"--async-scheduling\"]" \
      step "$s" python3 -m load.bench_policies --concurrency 1,16 --reps 2 --prompts 8 \
      --policies 0:0,1:1,3:3,1:3,adaptive --out "$RES/$s" ;;
  bench-paired)  # more, shorter repetitions of fewer policies: a cell's noise is mostly its own (sessions 9-10:
    # log deviations from the policy's mean differ by 0.09-0.11 rms between neighbours, 0.13-0.20 five or six apart)
    PHASESPEC_ENGINE__DRAFTER=self-draft PHASESPEC_VLLM_ARGS="[$GPU, \"--async-scheduling\"]" \
      step "$s" python3 -m load.bench_policies --concurrency ${CONC:-1,4,16,64} --reps 6 --prompts 8 \
      --requests-per-slot 4 --policies 0:0,1:1,adaptive,1:1=aa --out "$RES/$s" ;;
  bench-core-time)  # adaptive's depth-1 steps took ~14.3 ms against fixed-1's 12.4 at c=64 (session 18): the
    # engine core's schedule/update time per step, and adaptive capped at 1 (no depth 2-3 windows)
    PHASESPEC_ENGINE__DRAFTER=self-draft PHASESPEC_VLLM_ARGS="[$GPU, \"--async-scheduling\"]" \
      step "$s" python3 -m load.bench_policies --concurrency ${CONC:-16,64} --reps 4 --prompts 8 \
      --requests-per-slot 3 --policies 0:0,1:1,adaptive,adaptive@1:1,1:1=aa --out "$RES/$s" ;;
  bench-probe)  # the host's speed drifts 2x within a run (session 19): each cell beside an engine-core CPU probe
    PHASESPEC_ENGINE__DRAFTER=self-draft PHASESPEC_VLLM_ARGS="[$GPU, \"--async-scheduling\"]" \
      step "$s" python3 -m load.bench_policies --concurrency ${CONC:-4,16,64} --reps ${REPS:-6} --prompts 8 \
      --requests-per-slot 3 --policies 0:0,1:1,adaptive,adaptive@1:1,1:1=aa \
      --controller "$CONTROLLER" --out "$RES/$s" ;;
  bench-arms)  # two choosers' rules interleaved on one engine (bench_policies --arm): adaptive as shipped
    # against adaptive with no re-runs of passed-over depths (explore_share 0), with fixed-1 and its A/A
    # (ARM_POLICIES overrides the policy list; twenty-fourth session: ARM_NAME=finish
    # ARM='{"step_drain_finish": true}' ARM_POLICIES=0:0,1:1,adaptive,adaptive=finish,1:1=aa; ARM2=NAME=JSON
    # a second arm, named in ARM_POLICIES too)
    PHASESPEC_ENGINE__DRAFTER=self-draft PHASESPEC_VLLM_ARGS="[$GPU, \"--async-scheduling\"]" \
      step "$s" python3 -m load.bench_policies --concurrency ${CONC:-16,64} --reps ${REPS:-6} --prompts 8 \
      --requests-per-slot 3 --policies ${ARM_POLICIES:-0:0,1:1,adaptive,adaptive=${ARM_NAME:-noexp},adaptive@1:1,1:1=aa} \
      --arm "${ARM_NAME:-noexp}=${ARM:-{\"explore_share\": 0\}}" ${ARM2:+--arm "$ARM2"} \
      --controller "$CONTROLLER" --out "$RES/$s" ;;
  bench-decompose)  # wall time per engine step and tokens per step, by policy (cells.csv)
    PHASESPEC_ENGINE__DRAFTER=self-draft PHASESPEC_VLLM_ARGS="[$GPU, \"--async-scheduling\"]" \
      step "$s" python3 -m load.bench_policies --concurrency 16,64 --reps 3 --prompts 8 \
      --requests-per-slot 3 --policies 0:0,1:1,3:3,adaptive --out "$RES/$s" ;;
  tests-sampled-selfdraft)  # the thinking budget under sampling (one of 40 unended on 0.26 GPU)
    PHASESPEC_ENGINE__DRAFTER=self-draft PHASESPEC_VLLM_ARGS="[$GPU, \"--async-scheduling\"]" \
      step "$s" python3 -m pytest -p no:cacheprovider -rA \
      "tests/test_api.py::test_the_thinking_budget_holds_under_sampling" ;;
  bench-serve)  # plain vLLM against phasespec (off, on) with vLLM's bench client, same engine flags, no budget;
    # the three servers up side by side (0.3 of the GPU each), rounds rotating the order
    PHASESPEC_ENGINE__DRAFTER=self-draft PHASESPEC_VLLM_ARGS="[$GPU, \"--async-scheduling\"]" \
      step "$s" python3 -m load.bench_serve_overhead --concurrency 1,16 --rounds 3 --side-by-side \
      --servers vllm,phasespec-off,phasespec-on --out "$RES/$s" ;;
  probe-structured)  # plain vLLM, K=1 and 3: is a named tool call's greedy text K-dependent? (phasespec's was on 0.23.0)
    PHASESPEC_ENGINE__DRAFTER=self-draft PHASESPEC_VLLM_ARGS="[$GPU, \"--async-scheduling\"]" \
      step "$s" python3 -m load.structured_probe --k 1,3 --out "$RES/$s" ;;
  tests-budget)  # thinking budgets of concurrent requests in steps without drafts (engine/vllm_fixes.py)
    PHASESPEC_ENGINE__DRAFTER=self-draft PHASESPEC_VLLM_ARGS="[$GPU, \"--async-scheduling\"]" \
      step "$s" python3 -m pytest -p no:cacheprovider -rA tests/test_vllm_fixes.py \
      "tests/test_api.py::test_concurrent_requests_held_at_depth_0_all_end_their_reasoning_at_the_budget" \
      "tests/test_api.py::test_the_thinking_budget_holds_under_sampling" \
      "tests/test_api.py::test_a_requests_own_thinking_budget_reasons_to_it_and_answers" ;;
  tests-toolcall)  # the named tool call with phase switching against fixed K (depth-dependent on 0.23.0)
    PHASESPEC_ENGINE__DRAFTER=self-draft PHASESPEC_VLLM_ARGS="[$GPU, \"--async-scheduling\"]" \
      step "$s" python3 -m pytest -p no:cacheprovider -rA \
      "tests/test_phase_server.py::test_phase_switching_leaves_tool_calls_unchanged" \
      "tests/test_phase_server.py::test_a_forced_tool_call_is_tracked_and_drafted_as_tool_call" ;;
  tests-ngramgpu-fdo)
    PHASESPEC_VLLM_ARGS="[$GPU, $NGRAM_GPU, $FDO]" \
      step "$s" python3 -m pytest -p no:cacheprovider -rA tests/test_depth_hook.py ;;
  esac
done
echo "[gpu] $(date +%T) done"
