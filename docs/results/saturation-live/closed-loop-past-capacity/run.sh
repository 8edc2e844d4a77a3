#!/bin/bash
# Past capacity, live: agentic-closed seed 3 at 1.90 (in the simulator every router on the KV
# index collapses there within 240 s); clients retry a 429 twice after Retry-After.
cd /work/main
export HF_ENDPOINT=http://127.0.0.1:9 HF_HUB_OFFLINE=1
VENV=/work/main/.venv
COMMON="--worker-urls {workers} --host 127.0.0.1 --port {port} --prometheus-host 127.0.0.1 --prometheus-port {metrics_port} --log-level warn --disable-retries --disable-circuit-breaker"
SMG="$VENV/bin/smg-1.13 launch $COMMON"
SG="$VENV/bin/python -m sglang_router.launch_router $COMMON"
LL=target/release/loadlink
(while true; do echo "$(date +%T) $(cat /proc/loadavg)"; sleep 15; done) > /work/runs/live/loadavg.txt &
LA=$!
$LL bench live --scenario agentic-closed --seed 3 --load 1.9 --duration 300 --warmup 120 --time-scale 1 \
  --client-retries 2 --out /work/runs/live/out \
  --variant min_ttft/backlog \
  --variant "min_ttft/backlog --max-predicted-wait-ms 500 --admission-spare-running" \
  --variant "min_ttft/backlog --max-predicted-wait-ms 500" \
  --external-router "smg113-cache_aware=$SMG --policy cache_aware" \
  --external-router "sglang-router-0.3.2-cache_aware=$SG --policy cache_aware"
kill $LA
