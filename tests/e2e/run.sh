#!/usr/bin/env bash
# gpuwm end-to-end on kind: one command, needs docker, kind, kubectl and helm (or .venv-helm).
#
#   bash tests/e2e/run.sh            # create the cluster, test, delete the cluster
#   KEEP_CLUSTER=1 bash tests/e2e/run.sh   # leave the cluster up to look around
#
# Steps: build the image (tag = the chart's appVersion) and a fake-NVML variant, create a kind
# cluster whose worker has the nvidia.com/gpu.present label and 2 fake nvidia.com/gpu, install
# the chart, run a pod holding one GPU, make the fake NVML report that pod's process at 60 % SM,
# then check `kubectl get gpuworkloadmetrics` and the metrics API (with and without a token).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
E2E="$ROOT/tests/e2e"
CLUSTER="${CLUSTER:-gpuwm-e2e}"
NAMESPACE=gpuwm
TIMEOUT_S="${TIMEOUT_S:-240}"
APP_VERSION="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$ROOT/charts/gpuwm/Chart.yaml")"
IMAGE="ghcr.io/gpuwm/gpuwm:$APP_VERSION"
FAKE_IMAGE="$IMAGE-fakenvml"
WORKER="$CLUSTER-worker"

log() { printf '[e2e %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
fail() { log "FAIL: $*"; exit 1; }

for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || fail "$tool is not installed"
done
docker info >/dev/null 2>&1 || fail "the Docker daemon is not reachable"

cleanup() {
  local status=$?
  if [[ $status -ne 0 ]]; then
    log "diagnostics:"
    kubectl get pods -A -o wide || true
    kubectl -n "$NAMESPACE" logs -l app.kubernetes.io/component=controller --tail=80 --all-containers || true
    kubectl -n "$NAMESPACE" logs -l app.kubernetes.io/component=agent --tail=80 || true
  fi
  if [[ -n "${PORT_FORWARD_PID:-}" ]]; then kill "$PORT_FORWARD_PID" 2>/dev/null || true; fi
  if [[ "${KEEP_CLUSTER:-0}" != 1 ]]; then
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  fi
  exit $status
}
trap cleanup EXIT

log "building $IMAGE and $FAKE_IMAGE"
docker build -t "$IMAGE" "$ROOT"
docker build -t "$FAKE_IMAGE" --build-arg BASE="$IMAGE" -f "$E2E/Dockerfile.fakenvml" "$ROOT/tests/fakenvml"

mkdir -p /tmp/gpuwm-e2e
scenario() {  # the fake NVML scenario: 2 GPUs; optional process line for the holder pod
  {
    echo "driver version=550.54.15"
    echo "gpu uuid=GPU-e2e-0 name=NVIDIA_H100_80GB_HBM3 memory_total_mib=81559 memory_used_mib=2048 power_mw=250000 power_limit_mw=700000 energy_mj=0 util=60 instant_util=60 mem_util=10"
    echo "gpu uuid=GPU-e2e-1 name=NVIDIA_H100_80GB_HBM3 memory_total_mib=81559 memory_used_mib=0 power_mw=70000 power_limit_mw=700000 energy_mj=0 util=0 instant_util=0 mem_util=0"
    if [[ -n "${1:-}" ]]; then echo "proc device=GPU-e2e-0 pid=$1 used_mib=2000 sm=60 mem=10"; fi
  } >/tmp/gpuwm-e2e/scenario.new
  mv /tmp/gpuwm-e2e/scenario.new /tmp/gpuwm-e2e/scenario
}
scenario ""

if ! kind get clusters | grep -qx "$CLUSTER"; then
  log "creating kind cluster $CLUSTER"
  kind create cluster --name "$CLUSTER" --config "$E2E/kind-config.yaml" --wait 180s
fi
kubectl config use-context "kind-$CLUSTER" >/dev/null
kind load docker-image --name "$CLUSTER" "$FAKE_IMAGE"

log "advertising 2 fake nvidia.com/gpu on $WORKER"
kubectl patch node "$WORKER" --subresource=status --type=json \
  -p '[{"op":"add","path":"/status/capacity/nvidia.com~1gpu","value":"2"}]'

log "installing the chart"
kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f -
# The agent mounts host paths (pod-resources, /proc): its namespace cannot enforce baseline/restricted.
kubectl label namespace "$NAMESPACE" pod-security.kubernetes.io/enforce=privileged --overwrite
if command -v helm >/dev/null; then
  helm upgrade --install gpuwm "$ROOT/charts/gpuwm" -n "$NAMESPACE" \
    -f "$E2E/e2e-values.yaml" --set image.tag="$APP_VERSION-fakenvml" --wait --timeout "${TIMEOUT_S}s"
else
  [[ -x "$ROOT/.venv-helm/bin/python" ]] || fail "neither helm nor .venv-helm (python3.12 -m venv .venv-helm; pip install helm-sdkpy pyyaml)"
  printf 'image:\n  tag: "%s"\n' "$APP_VERSION-fakenvml" >/tmp/gpuwm-e2e/tag-values.yaml
  "$ROOT/.venv-helm/bin/python" "$ROOT/tests/chart/helm_driver.py" install "$ROOT/charts/gpuwm" \
    "$E2E/e2e-values.yaml" /tmp/gpuwm-e2e/tag-values.yaml --namespace "$NAMESPACE" --release gpuwm \
    --kubeconfig "${KUBECONFIG:-$HOME/.kube/config}" | tee /tmp/gpuwm-e2e/install.json
  grep -q '"ok": true' /tmp/gpuwm-e2e/install.json || fail "helm install failed"
fi
kubectl -n "$NAMESPACE" rollout status deployment/gpuwm-controller --timeout "${TIMEOUT_S}s"
kubectl -n "$NAMESPACE" rollout status daemonset/gpuwm-agent --timeout "${TIMEOUT_S}s"
[[ "$(kubectl -n "$NAMESPACE" get pods -l app.kubernetes.io/component=agent -o jsonpath='{.items[*].spec.nodeName}')" == "$WORKER" ]] \
  || fail "the agent should run on the GPU worker only"

log "running a pod that holds one GPU"
sed "s#ghcr.io/gpuwm/gpuwm:e2e-fakenvml#$FAKE_IMAGE#" "$E2E/gpu-holder.yaml" | kubectl apply -f -
kubectl -n e2e wait pod/gpu-holder --for=condition=Ready --timeout "${TIMEOUT_S}s"
container_id="$(docker exec "$WORKER" crictl ps -q --name holder | head -n1)"
pid="$(docker exec "$WORKER" crictl inspect --output go-template --template '{{.info.pid}}' "$container_id")"
[[ "$pid" =~ ^[0-9]+$ ]] || fail "could not find the holder's host pid (got '$pid')"
log "the holder's process is pid $pid on $WORKER; the fake NVML now reports it at 60 % SM"
scenario "$pid"

log "waiting for GPUWorkloadMetrics e2e/gpu-holder"
deadline=$((SECONDS + TIMEOUT_S))
until [[ "$(kubectl -n e2e get gpuworkloadmetrics gpu-holder -o jsonpath='{.status.allocatedGpus}' 2>/dev/null)" == 1* ]]; do
  (( SECONDS < deadline )) || fail "no GPUWorkloadMetrics with allocatedGpus=1 for e2e/gpu-holder after ${TIMEOUT_S}s"
  sleep 5
done
kubectl get gpuworkloadmetrics -A
kubectl get gpuprojectmetrics
project="$(kubectl -n e2e get gpuworkloadmetrics gpu-holder -o jsonpath='{.spec.project}')"
[[ "$project" == e2e-project ]] || fail "project should come from the namespace label, got '$project'"
until [[ -n "$(kubectl -n e2e get gpuworkloadmetrics gpu-holder -o jsonpath='{.status.lastActiveTime}')" ]]; do
  (( SECONDS < deadline )) || fail "the workload never became active although its process uses 60 % SM"
  sleep 5
done

log "checking the metrics API"
kubectl -n "$NAMESPACE" port-forward svc/gpuwm-controller 18080:8080 >/tmp/gpuwm-e2e/port-forward.log 2>&1 &
PORT_FORWARD_PID=$!
for _ in $(seq 30); do curl -fsS http://127.0.0.1:18080/healthz >/dev/null 2>&1 && break; sleep 1; done
status="$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:18080/api/v1/namespaces/e2e/workloads/gpu-holder)"
[[ "$status" == 401 ]] || fail "the API answered $status without a token (want 401)"
token="$(kubectl -n e2e create token metrics-reader)"
body="$(curl -fsS -H "Authorization: Bearer $token" http://127.0.0.1:18080/api/v1/namespaces/e2e/workloads/gpu-holder)"
grep -q '"gpu-holder"' <<<"$body" || fail "the API does not describe gpu-holder: $body"
curl -fsS -H "Authorization: Bearer $token" \
  "http://127.0.0.1:18080/api/v1/namespaces/e2e/workloads/gpu-holder/metrics?metric=gpu_utilization_percent&step=5s" \
  | grep -q '"series"' || fail "no time series from the API"

log "PASS"
