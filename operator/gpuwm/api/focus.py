"""A period's GPU cost as a FinOps FOCUS (1.2) Cost and Usage dataset (`GET /api/v1/report?format=focus`).

Finance tools read FOCUS: one row per charge, its cost in BilledCost / EffectiveCost / ListCost /
ContractedCost (all the same here: the configured price is the only price), its quantity in
PricingQuantity / ConsumedQuantity of one unit. The rows are the per-run report's (`by=workload`), so the
file's totals are the report's: the sum of BilledCost is the report's total cost.

- Each priced run has a "GPU Time" charge: its allocated GPU-hours of the period (units x hours: a MIG
  slice or a time-sliced replica counts its share) at its price per GPU-hour. Its `x_` columns carry the
  run's other figures (active, idle, unmonitored GPU-hours, idle cost, mean utilisation, peak, exactness),
  on this row only, so each column also sums to the report's.
- Where energy is priced, a run with energy has a "GPU Energy" charge of its kWh: FOCUS gives a row one
  pricing unit, and a kWh is not a GPU-hour.
- A run with no price per GPU-hour has no GPU Time charge (a cost of nothing is no charge): the report's
  `unpricedGpuHours` says how many GPU-hours the file leaves out.

The run is the resource (ResourceId its UID, ResourceName namespace/name, ResourceType its kind), the project
the sub account, and the names go into Tags as JSON under `gpuwm.io/`. Text cells are neutralised as the
report's CSV is (`csv_text_cell`).
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass

from gpuwm.api.report import Report, ReportRow, csv_text_cell

JOULES_PER_KWH = 3.6e6
FOCUS_COLUMNS = (
    "BilledCost", "BillingAccountId", "BillingAccountName", "BillingCurrency", "BillingPeriodEnd",
    "BillingPeriodStart", "ChargeCategory", "ChargeClass", "ChargeDescription", "ChargeFrequency", "ChargePeriodEnd",
    "ChargePeriodStart", "ConsumedQuantity", "ConsumedUnit", "ContractedCost", "ContractedUnitPrice", "EffectiveCost",
    "InvoiceIssuerName", "ListCost", "ListUnitPrice", "PricingCategory", "PricingQuantity", "PricingUnit",
    "ProviderName", "PublisherName", "ResourceId", "ResourceName", "ResourceType", "ServiceCategory", "ServiceName",
    "SkuId", "SkuMeter", "SubAccountId", "SubAccountName", "Tags",
)
EXTRA_COLUMNS = (
    "x_Project", "x_Namespace", "x_Workload", "x_ActiveGpuHours", "x_IdleGpuHours", "x_UnmonitoredGpuHours",
    "x_IdleCost", "x_MeanUtilizationPercent", "x_PeakAllocatedGpus", "x_Exact", "x_ApportionedGpuHours",
    "x_ApportionedCost",
)
#: the columns written by `_number`: a number is written as one, never neutralised (a negative one is no formula)
NUMERIC_COLUMNS = frozenset({
    "BilledCost", "ConsumedQuantity", "ContractedCost", "ContractedUnitPrice", "EffectiveCost", "ListCost",
    "ListUnitPrice", "PricingQuantity", *(column for column in EXTRA_COLUMNS if column.endswith(("Hours", "Cost",
                                                                                                "Percent", "Gpus"))),
})
GPU_TIME = "GPU Time"
GPU_ENERGY = "GPU Energy"
_SKU = {GPU_TIME: "gpuwm-gpu-time", GPU_ENERGY: "gpuwm-gpu-energy"}
_UNIT = {GPU_TIME: "GPU-Hours", GPU_ENERGY: "kWh"}


@dataclass(frozen=True)
class FocusParty:
    """Who provides, publishes and invoices the GPUs, and the billing account: the cluster (`clusterId`)."""

    name: str

    @classmethod
    def of_cluster(cls, cluster_id: str) -> FocusParty:
        return cls(name=cluster_id or "Kubernetes")


@dataclass(frozen=True)
class Charge:
    """One FOCUS row: a run's charge of one meter."""

    meter: str
    quantity: float
    unit_price: float
    cost: float


def iso_utc(t: float) -> str:
    """FOCUS's date/time form: ISO 8601 in UTC to the second, with Z."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _number(value: float) -> str:
    """A decimal with no exponent (FOCUS NumericFormat), to the nano-unit: rows add up to the report's totals."""
    return f"{value:.9f}"


def charges(row: ReportRow, energy_price_per_kwh: float) -> Iterator[Charge]:
    """A per-run report row's charges: its GPU time where priced, its energy where energy is priced."""
    price = row.price_per_gpu_hour
    if price is not None and row.allocated_gpu_hours > 0:
        yield Charge(GPU_TIME, row.allocated_gpu_hours, price, row.allocated_gpu_hours * price)
    if energy_price_per_kwh > 0 and row.energy_joules > 0 and row.energy_cost is not None:
        yield Charge(GPU_ENERGY, row.energy_joules / JOULES_PER_KWH, energy_price_per_kwh, row.energy_cost)


def _focus_cells(row: ReportRow, charge: Charge, report: Report, party: FocusParty) -> dict[str, str]:
    period = {"BillingPeriodStart": iso_utc(report.start), "BillingPeriodEnd": iso_utc(report.end),
              "ChargePeriodStart": iso_utc(report.start), "ChargePeriodEnd": iso_utc(report.end)}
    cost, quantity = _number(charge.cost), _number(charge.quantity)
    resource = f"{row.namespace}/{row.workload}"
    tags = {"gpuwm.io/project": row.project, "gpuwm.io/namespace": row.namespace, "gpuwm.io/workload": row.workload,
            "gpuwm.io/kind": row.kind}
    return {
        **period, "BilledCost": cost, "EffectiveCost": cost, "ListCost": cost, "ContractedCost": cost,
        "BillingAccountId": party.name, "BillingAccountName": party.name, "BillingCurrency": report.currency or "",
        "ChargeCategory": "Usage", "ChargeClass": "", "ChargeFrequency": "Usage-Based",
        "ChargeDescription": f"{charge.meter} of {row.kind or 'workload'} {resource}",
        "ConsumedQuantity": quantity, "ConsumedUnit": _UNIT[charge.meter], "PricingQuantity": quantity,
        "PricingUnit": _UNIT[charge.meter], "ListUnitPrice": _number(charge.unit_price),
        "ContractedUnitPrice": _number(charge.unit_price), "PricingCategory": "Standard",
        "InvoiceIssuerName": party.name, "ProviderName": party.name, "PublisherName": party.name,
        "ResourceId": row.workload_uid or "", "ResourceName": resource, "ResourceType": row.kind or "",
        "ServiceCategory": "Compute", "ServiceName": "Kubernetes GPUs", "SkuId": _SKU[charge.meter],
        "SkuMeter": charge.meter, "SubAccountId": row.project or "", "SubAccountName": row.project or "",
        "Tags": json.dumps({key: value for key, value in tags.items() if value is not None}, sort_keys=True),
    }


def _extra_cells(row: ReportRow, charge: Charge) -> dict[str, str]:
    cells = {"x_Project": row.project or "", "x_Namespace": row.namespace or "", "x_Workload": row.workload or "",
             "x_Exact": "true" if row.exact else "false"}
    if charge.meter != GPU_TIME:
        return cells
    utilization = row.mean_utilization_percent
    return {
        **cells, "x_ActiveGpuHours": _number(row.active_gpu_hours), "x_IdleGpuHours": _number(row.idle_gpu_hours),
        "x_UnmonitoredGpuHours": _number(row.unmonitored_gpu_hours), "x_IdleCost": _number(row.idle_cost or 0.0),
        "x_MeanUtilizationPercent": "" if utilization is None else _number(utilization),
        "x_PeakAllocatedGpus": _number(row.peak_allocated_gpus),
        "x_ApportionedGpuHours": _number(row.apportioned_gpu_hours),
        "x_ApportionedCost": _number(row.apportioned_cost or 0.0),
    }


def focus_csv(report: Report, energy_price_per_kwh: float, party: FocusParty) -> str:
    """The FOCUS rows of a per-run (`by=workload`) priced report: FOCUS columns, then the `x_` ones."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    columns = FOCUS_COLUMNS + EXTRA_COLUMNS
    writer.writerow(columns)
    for row in report.rows:
        for charge in charges(row, energy_price_per_kwh):
            cells = {**_focus_cells(row, charge, report, party), **_extra_cells(row, charge)}
            writer.writerow([cells.get(column, "") if column in NUMERIC_COLUMNS else csv_text_cell(cells.get(column, ""))
                             for column in columns])
    return out.getvalue()

