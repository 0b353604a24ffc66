"""gpuwm agent: the per-node NVML sampler (DESIGN §2 "agent").

- `nvml`: readings of every GPU and MIG instance through pynvml (nvidia-ml-py).
- `podresources`: kubelet pod-resources v1 gRPC client, cached; `cgroup`: PID -> pod UID fallback.
- `attribution`: pure decisions (units of replicas and MIG slices, containers, GPU state).
- `kubelet`: per-pod CPU/memory/network/storage from the stats summary.
- `core`: the poll loop and state; `buffer`: compressed `/v1/snapshot` records.
- `metrics`, `server`, `command`: `/metrics`, the HTTP server, `gpuwm agent`.
"""
