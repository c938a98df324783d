#!/usr/bin/env bash
# README's demo flow against `npm start` on an empty embedded data directory, then the server's
# resting RSS (MB): what issue-level memory targets are measured with.
#   bash scripts/demo-flow-rss.sh
set -euo pipefail
cd "$(dirname "$0")/.."
data=$(mktemp -d)
log=$(mktemp)
port=$(( 20000 + RANDOM % 20000 ))
env -u DATABASE_URL PORT=$port DIMAS_DATA_DIR="$data" SUPERADMIN_PASSWORD="rss-check-password-$RANDOM" setsid npm start >"$log" 2>&1 &
pid=$!
cleanup() { kill -- -"$pid" 2>/dev/null || true; rm -rf "$data"; }
trap cleanup EXIT
B="http://127.0.0.1:$port"
for _ in $(seq 1 120); do curl -fs "$B/api/health" >/dev/null 2>&1 && break; sleep 1; done
server_pid=$(pgrep -g "$pid" -f "^[^ ]*node .*src/main.ts" | head -n 1)
rss() { awk '/VmRSS/ {print int($2/1024)}' /proc/"$server_pid"/status; }
echo "rss after start: $(rss) MB"
password=$(sed -n 's/.*"domain":"demo.local","password":"\([^"]*\)".*/\1/p' "$data/credentials.txt" | head -n 1)
T=$(curl -fsS -X POST "$B/api/auth/login" -H 'content-type: application/json' \
  -d "{\"username\":\"admin\",\"domain\":\"demo.local\",\"password\":\"$password\"}" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).token))')
H="authorization: Bearer $T"; J='content-type: application/json'
q() { local out; out=$(curl -sS -w "\n%{http_code}" "$@"); local code=${out##*$'\n'}; if [ "${code:0:1}" != "2" ]; then echo "FAILED ($code): $* → ${out%$'\n'*}" | cut -c1-600; return 1; fi; }
q -X POST "$B/api/schemas/templates/customer-360/assign" -H "$H"
q -X POST "$B/api/schemas/workspace/sync" -H "$H" -H "$J" -d '{}'
q -N -X POST "$B/api/workspaces/discover" -H "$H"
q "$B/api/mappings/customers" -H "$H"
q "$B/api/mappings/customers/transform-code" -H "$H"
q -X POST "$B/api/mappings/customers/preview-transformation" -H "$H" -H "$J" -d '{}'
q -X POST "$B/api/mappings/customers/transformation-diff" -H "$H" -H "$J" -d '{}'
q -X POST "$B/api/mappings/customers/commit-transformation" -H "$H" -H "$J" -d '{"message":"first cut"}'
q -X POST "$B/api/mappings/customers/materialize" -H "$H" -H "$J" -d '{}'
for _ in $(seq 1 60); do
  curl -fsS "$B/api/mappings/customers" -H "$H" | grep -q '"status":"succeeded"' && break; sleep 1
done
q -X POST "$B/api/pipelines/generate-project" -H "$H" -H "$J" -d '{}'
q "$B/api/monitoring/metrics/workspace" -H "$H"
q -X POST "$B/api/analytics/execute" -H "$H" -H "$J" -d '{"sql":"select count(*) from analytics.customers"}'
echo "rss after the demo flow: $(rss) MB"
sleep 10
echo "rss at rest 10 s later: $(rss) MB"
# A second start on the same data directory (no initdb, no seeding): the everyday case.
kill -TERM "$server_pid"; wait "$pid" || true
env -u DATABASE_URL PORT=$port DIMAS_DATA_DIR="$data" setsid npm start >>"$log" 2>&1 &
pid=$!
for _ in $(seq 1 120); do curl -fs "$B/api/health" >/dev/null 2>&1 && break; sleep 1; done
server_pid=$(pgrep -g "$pid" -f "^[^ ]*node .*src/main.ts" | head -n 1)
T=$(curl -fsS -X POST "$B/api/auth/login" -H 'content-type: application/json' \
  -d "{\"username\":\"admin\",\"domain\":\"demo.local\",\"password\":\"$password\"}" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).token))')
H="authorization: Bearer $T"
q "$B/api/mappings/customers" -H "$H"
q -X POST "$B/api/analytics/execute" -H "$H" -H "$J" -d '{"sql":"select count(*) from analytics.customers"}'
sleep 10
echo "rss at rest after a restart on the same data: $(rss) MB"
