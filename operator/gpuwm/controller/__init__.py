"""gpuwm controller: the kopf operator that keeps GPUWorkloadMetrics and GPUProjectMetrics current.

Its rooms (docs/architecture.md): `kube` (API access), `pull` (agents -> intake), `watch` (pods,
owners, workload objects), `status` (CR status and Events), `state` (the ControllerState, its file
and recovery); `runtime` runs the status cycle, `handlers` wires it to kopf, `command` is the entry.
Importing this package has no side effects: `command.run` imports kopf through
`kopf_import.import_kopf_without_clients` first.
"""
