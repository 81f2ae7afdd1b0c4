#!/usr/bin/env bash
# make demo: a 2-node lab on this machine (nodes and pods as network namespaces), the example workloads, traffic
# across nodes by Service VIP and by pod IP, the kubectl and ambit views, then everything torn down.
set -euo pipefail
cd "$(dirname "$0")/.."
AMBIT=.venv/bin/ambit
DIR=$(mktemp -d /tmp/ambit-demo.XXXXXX)
export KUBECONFIG="$DIR/kubeconfig" KUBECACHEDIR="$DIR/kubecache"
up=""
cleanup() {
  if [ -n "$up" ]; then "$AMBIT" lab down --dir "$DIR" >/dev/null || true; fi
  rm -rf "$DIR"
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
wait_ready() {  # wait_ready NAMESPACE SELECTOR COUNT
  for _ in $(seq 1 120); do
    ready=$(kubectl get pods -n "$1" -l "$2" -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True || true)
    [ "$ready" -ge "$3" ] && return 0
    sleep 0.5
  done
  echo "pods $2 in $1 not ready in time"; kubectl get pods -n "$1" -o wide; return 1
}
in_pod() {  # in_pod NAMESPACE POD -- CMD...
  local ns=$1 pod=$2; shift 3
  "$AMBIT" lab exec --dir "$DIR" -n "$ns" "$pod" -- "$@"
}

# A lab uses fixed addresses, so one runs at a time on a machine: the tests and benchmarks take this lock for
# theirs, and the demo waits for it the same way (the lab's daemons do not inherit it).
exec 9>/run/lock/ambit-lab-root.lock
if ! flock -n 9; then
  echo "waiting for another lab (a test or benchmark run) to finish: /run/lock/ambit-lab-root.lock"
  flock 9
fi

step "ambit lab up --nodes 2   (API server, controllers, a node runtime per node; then the mesh installed from deploy/)"
up=1
"$AMBIT" lab up --dir "$DIR" --nodes 2
kubectl get nodes -o wide
kubectl get daemonsets,deployments,pods -n istio-system -o wide

step "kubectl apply -f examples/bookinfo-lite.yaml -f examples/lab/apps.yaml"
kubectl apply -f examples/bookinfo-lite.yaml -f examples/lab/apps.yaml
wait_ready apps app=http-echo 2
wait_ready apps app=tcp-echo 1
wait_ready apps app=server-first 1
wait_ready apps app=client 1

http_vip=$(kubectl get service http-echo -n apps -o jsonpath='{.spec.clusterIP}')
tcp_vip=$(kubectl get service tcp-echo -n apps -o jsonpath='{.spec.clusterIP}')
banner_vip=$(kubectl get service server-first -n apps -o jsonpath='{.spec.clusterIP}')

step "kubectl get pods,services,endpointslices -n apps -o wide"
kubectl get pods,services,endpointslices -n apps -o wide

step "client pod → http://http-echo/ (cluster DNS) → Service VIP $http_vip (nftables DNAT in the node, kube-proxy's job)"
# The client calls once a second from its start, which may come before the echo pods were Ready (a refused call
# then, as kube-proxy rejects a Service without ready endpoints): show the calls made since they were.
sleep 4
"$AMBIT" lab logs --dir "$DIR" -n apps client > "$DIR/client.log" || true
tail -n 3 "$DIR/client.log"

client_node=$(kubectl get pod client -n apps -o jsonpath='{.spec.nodeName}')
client_ip=$(kubectl get pod client -n apps -o jsonpath='{.status.podIP}')
far=$(kubectl get pods -n apps -l app=http-echo -o jsonpath="{range .items[?(@.spec.nodeName!='$client_node')]}{.status.podIP}{'\n'}{end}" | head -n 1)
if [ -n "$far" ]; then
  step "client ($client_ip on $client_node) → http-echo pod IP $far on the other node: the server sees the client's own IP"
  in_pod apps client -- python3 -m ambit.lab.apps client --url "http://$far:8080/" --count 2 --interval 0.2
fi

step "client → tcp-echo VIP $tcp_vip:9000 and server-first VIP $banner_vip:3306"
in_pod apps client -- python3 -m ambit.lab.apps client --tcp "$tcp_vip:9000" --count 1
in_pod apps client -- python3 -m ambit.lab.apps client --tcp "$banner_vip:3306" --server-first --count 1

step "kubectl label namespace apps istio.io/dataplane-mode=ambient   (running pods join the mesh, no restart)"
kubectl label namespace apps istio.io/dataplane-mode=ambient
for _ in $(seq 1 60); do
  pending=$(kubectl get pods -n apps -o jsonpath='{range .items[*]}{.metadata.annotations.ambient\.istio\.io/redirection}{"\n"}{end}' | grep -vc enabled || true)
  [ "$pending" -eq 0 ] && break
  sleep 0.5
done
kubectl get pods -n apps -o custom-columns='NAME:.metadata.name,NODE:.spec.nodeName,IP:.status.podIP,REDIRECTION:.metadata.annotations.ambient\.istio\.io/redirection'
sleep 2

step "client → http-echo VIP and pod IP, now through the node proxies: HBONE (mutual TLS, SPIFFE ids) between nodes"
in_pod apps client -- python3 -m ambit.lab.apps client --url "http://$http_vip:80/" --count 2 --interval 0.2
if [ -n "$far" ]; then
  in_pod apps client -- python3 -m ambit.lab.apps client --url "http://$far:8080/" --count 1
fi
in_pod apps client -- python3 -m ambit.lab.apps client --tcp "$banner_vip:3306" --server-first --count 1

ztunnel_logs() {  # the node proxies' logs: the ztunnel pods' containers
  for pod in $(kubectl get pods -n istio-system -l app=ztunnel -o jsonpath='{.items[*].metadata.name}'); do
    "$AMBIT" lab logs --dir "$DIR" -n istio-system "$pod" || true
  done
}
ztunnel_1=$(kubectl get pods -n istio-system -l app=ztunnel --field-selector spec.nodeName=node-1 -o jsonpath='{.items[0].status.podIP}')
step "node proxy telemetry: Istio's TCP metrics (node-1's ztunnel pod $ztunnel_1 :15020) and the access log"
curl -s "http://$ztunnel_1:15020/metrics" | grep '^istio_tcp_connections_opened_total' | head -n 3 | cut -c1-400 || true
ztunnel_logs | grep -h "connection complete" | tail -n 3 || true

step "L4 policy: only the client's identity may call http-echo; nobody may call tcp-echo (DENY)"
kubectl apply -f - <<'YAML'
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-client, namespace: apps}
spec:
  selector: {matchLabels: {app: http-echo}}
  rules: [{from: [{source: {principals: ["cluster.local/ns/apps/sa/default"]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-tcp-echo, namespace: apps}
spec:
  selector: {matchLabels: {app: tcp-echo}}
  action: DENY
  rules: [{}]
YAML
sleep 2
in_pod apps client -- python3 -m ambit.lab.apps client --url "http://$http_vip:80/" --count 1
echo "client → tcp-echo (expected: refused by the destination's node proxy):"
in_pod apps client -- python3 -m ambit.lab.apps client --tcp "$tcp_vip:9000" --count 1 || true
"$AMBIT" policy explain --from apps/client --to apps/tcp-echo --port 9000
kubectl get authorizationpolicies -n apps -o custom-columns='NAME:.metadata.name,ZTUNNEL:.status.conditions[0].status,REASON:.status.conditions[0].reason,MESSAGE:.status.conditions[0].message'
ztunnel_logs | grep -h "explicitly denied" | tail -n 1 | cut -c1-300 || true

step "ambit dashboard: the topology page (solid = mTLS, dashed = plaintext, red = denied); a screenshot in bench/results/topology.png"
"$AMBIT" dashboard --lab-dir "$DIR" --port 0 > "$DIR/dashboard.out" 2> "$DIR/dashboard.err" &
dashboard=$!
url=""
for _ in $(seq 1 120); do
  url=$(grep -o 'http://127\.0\.0\.1:[0-9]*/' "$DIR/dashboard.out" || true)
  [ -n "$url" ] && break
  sleep 0.5
done
if [ -n "$url" ] && command -v chromium >/dev/null; then
  echo "serving on $url"
  summary='import json, sys
graph = json.load(sys.stdin)
print(len(graph["nodes"]), "nodes")
for e in graph["edges"]:
    if e["src"].startswith("wl:apps/"):
        print(" ", e["src"], "->", e["dst"], e["flows"], "flows,", e["mtls"], "mTLS,", e["denied"], "denied")'
  for _ in $(seq 1 60); do  # until the first flows are in (a picture for people, not a proof)
    curl -s "${url}api/graph" | grep -q '"edges":\[{' && break
    sleep 0.5
  done
  curl -s "${url}api/graph" | python3 -c "$summary" || true
  .venv/bin/python -m tests.integration.cdp "$url" bench/results/topology.png || echo "(no screenshot: the browser failed)"
else
  echo "(no topology page: $(head -c 300 "$DIR/dashboard.err"))"
fi
kill -TERM "$dashboard" 2>/dev/null || true
wait "$dashboard" || true
kubectl delete authorizationpolicies -n apps --all

step "ambit lab status"
"$AMBIT" lab status --dir "$DIR"

step "ambit get — the same cluster through Ambit's own client (ambit.k8s)"
"$AMBIT" get namespaces
"$AMBIT" get authorizationpolicies -n demo
"$AMBIT" get services -n apps

step "ambit lab down   (every namespace, link, route, rule, process and file the lab created)"
"$AMBIT" lab down --dir "$DIR"
up=""
echo "namespaces left with the lab's prefix: $(ip netns list | grep -c "^ab" || true)"
