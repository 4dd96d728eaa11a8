#!/usr/bin/env bash
# Rescale the sharded job of deploy/kubernetes/aiostream-ckpt.yaml to M shards, through
# savepoints (docs/shards.md, "Rescaling from N shards to M"):
#
#   deploy/kubernetes/rescale.sh M            (kubectl's current context and namespace)
#
# 1. scale the StatefulSet to 0: each pod gets SIGTERM and, with
#    shutdown.mode=savepoint, stops with a savepoint (its output up to it committed);
# 2. run `aiostream-ckpt rescale` once, in a pod on the same checkpoint volume: it
#    merges every shard's stop-with-savepoint into one restore point, or refuses
#    (naming the missing shards' key groups) and nothing changes;
# 3. point the StatefulSet at it and start M pods: pod J runs shard J/M.
#
# The inputs must line up with M (a topic of P partitions written by key group:
# M a divisor of P), or the new shards refuse to start, naming the counts that work.
set -euo pipefail

if [[ $# -ne 1 || ! $1 =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 M  (the new number of shards)" >&2
    exit 2
fi
new=$1
sts=${STS:-aiostream-ckpt}
claim=${CHECKPOINT_CLAIM:-aiostream-ckpt-checkpoints}
checkpoints=/var/lib/aiostream/checkpoints

image=$(kubectl get statefulset "$sts" -o jsonpath='{.spec.template.spec.containers[0].image}')
old=$(kubectl get statefulset "$sts" -o jsonpath='{.spec.replicas}')
echo "rescaling $sts from $old shard(s) to $new" >&2

kubectl scale statefulset "$sts" --replicas=0
kubectl wait --for=delete pod -l app.kubernetes.io/name=aiostream-ckpt --timeout=600s

overrides=$(cat <<JSON
{
  "spec": {
    "securityContext": {"runAsNonRoot": true, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001},
    "containers": [{
      "name": "rescale",
      "image": "$image",
      "args": ["rescale", "--checkpoint-dir", "$checkpoints", "--shards", "$new"],
      "volumeMounts": [{"name": "checkpoints", "mountPath": "/var/lib/aiostream"}]
    }],
    "volumes": [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": "$claim"}}]
  }
}
JSON
)
plan=$(kubectl run "$sts-rescale" --rm -i --quiet --restart=Never --image="$image" \
    --overrides="$overrides")
# the JSON line `rescale` prints on stdout (its explanation goes to stderr)
point=$(printf '%s\n' "$plan" | grep '^{"restore_point"' \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["restore_point"])')
echo "restore point: $point" >&2

kubectl set env statefulset "$sts" AIOSTREAM_SHARDS="$new" AIOSTREAM_JOB__RESTORE_FROM="$point"
kubectl scale statefulset "$sts" --replicas="$new"
kubectl rollout status statefulset "$sts" --timeout=600s
