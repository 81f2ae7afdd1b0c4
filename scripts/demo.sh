#!/usr/bin/env bash
# make demo: the embedded API server on this machine, the example manifests applied, shown with kubectl and ambit.
set -euo pipefail
cd "$(dirname "$0")/.."
AMBIT=.venv/bin/ambit
DIR=$(mktemp -d /tmp/ambit-demo.XXXXXX)
PORT=${AMBIT_DEMO_PORT:-16443}
export KUBECONFIG="$DIR/kubeconfig" KUBECACHEDIR="$DIR/kubecache"
server=""
cleanup() {
  if [ -n "$server" ] && kill -0 "$server" 2>/dev/null; then
    kill -TERM "$server"; wait "$server" || true
  fi
  rm -rf "$DIR"
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "ambit apiserver --data-dir $DIR --listen 127.0.0.1:$PORT"
exec 3< <("$AMBIT" apiserver --data-dir "$DIR" --listen "127.0.0.1:$PORT" 2>"$DIR/apiserver.log")
server=$!
if ! read -r -t 30 ready <&3; then
  echo "the API server did not start; its log:"; cat "$DIR/apiserver.log"; exit 1
fi
echo "$ready"

step "kubectl apply -f examples/"
kubectl apply -f examples/

step "kubectl get namespaces --show-labels"
kubectl get namespaces --show-labels

step "kubectl get deployments,services,serviceaccounts,configmaps -n demo -o wide"
kubectl get deployments,services,serviceaccounts,configmaps -n demo -o wide

step "kubectl get authorizationpolicies,peerauthentications -n demo"
kubectl get authorizationpolicies,peerauthentications -n demo

step "ambit get — the same objects through Ambit's own client (ambit.k8s)"
"$AMBIT" get namespaces
"$AMBIT" get authorizationpolicies -n demo
"$AMBIT" get services -n demo

step "stopping the API server (SIGTERM)"
kill -TERM "$server"; wait "$server" || true; server=""
echo "stopped cleanly"
