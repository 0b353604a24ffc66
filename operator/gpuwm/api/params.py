"""Query-parameter parsing for the metrics API: every bad value raises BadParameter naming it (HTTP 400)."""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, TypeVar, cast, get_args

from gpuwm.config import parse_duration_seconds
from gpuwm.store import MAX_POINTS_PER_SERIES, METRIC_INDEX, METRIC_NAMES, Breakdown

#: epoch values at or above this are milliseconds (1e11 s would be the year 5138)
_MILLIS_FROM = 1e11
_LATEST_SECONDS = 253402300799.0  # 9999-12-31T23:59:59Z
#: a step the grid and the store's integer times can hold: from a millisecond up to the whole span of
#: representable times (a larger one overflowed the store's 64-bit integers)
_SHORTEST_STEP_SECONDS = 0.001
_LONGEST_STEP_SECONDS = _LATEST_SECONDS
DEFAULT_STEP_SECONDS = 15.0

# -- the forms the parsers read, as the OpenAPI document declares them: a value matches exactly when its
# parser takes it, so the document admits no request the API then refuses for its form

_YEAR = r"(19[7-9][0-9]|[2-9][0-9]{3})"
#: 1972 .. 9996, every fourth year but the centuries not divisible by 400
_LEAP_YEAR = r"(19(7[26]|8[048]|9[26])|[2-9][0-9](0[48]|[2468][048]|[13579][26])|([2468][048]|[3579][26])00)"
_MONTH_DAY = r"((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))"
_CLOCK = r"[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
#: epoch seconds or milliseconds, or RFC 3339 with a zone, 1970 to 9999, each field in its range and each day
#: in its month (29 February in leap years)
TIME_PATTERN = rf"^\s*([0-9]+(\.[0-9]+)?|({_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29){_CLOCK})\s*$"
_NUMBER = r"[0-9]+(\.[0-9]+)?"
_NONZERO = r"([0-9]*[1-9][0-9]*(\.[0-9]+)?|[0-9]+\.[0-9]*[1-9][0-9]*)"
_UNIT = r"(ms|s|m|h|d|w)"
#: 5s, 1m30s, 250ms or a bare number of seconds, at least one part of it not zero
STEP_PATTERN = rf"^\s*((0+(\.0+)?{_UNIT})*{_NONZERO}{_UNIT}({_NUMBER}{_UNIT})*|{_NONZERO})\s*$"
_TIME_FORM = re.compile(TIME_PATTERN)
_STEP_FORM = re.compile(STEP_PATTERN)
BREAKDOWNS: tuple[str, ...] = get_args(Breakdown)
_Key = TypeVar("_Key")


class BadParameter(ValueError):
    """A query parameter with a bad value; the API answers 400 with `parameter` and the message."""

    def __init__(self, parameter: str, message: str) -> None:
        self.parameter = parameter
        self.message = message
        super().__init__(f"{parameter}: {message}")


def parse_time(parameter: str, text: str) -> float:
    """Epoch seconds from RFC 3339 (`2026-11-22T10:00:00Z`), epoch seconds or epoch milliseconds (TIME_PATTERN).

    The times the API holds run from 1970 to 9999: an epoch value past the year 9999, or a zone that moves the
    first minutes of 1970 before the epoch (or the last of 9999 past its end), is read at that end."""
    value = text.strip()
    if not value:
        raise BadParameter(parameter, "is empty; give RFC 3339, epoch seconds or epoch milliseconds")
    if not _TIME_FORM.fullmatch(text):
        raise BadParameter(
            parameter, f"{text[:80]!r} is not RFC 3339 (2026-11-22T10:00:00Z, a real day of 1970 .. 9999), epoch "
            "seconds or epoch milliseconds",
        )
    if value[0].isdigit() and value.replace(".", "", 1).isdigit():
        number = float(value)
        seconds = number / 1000.0 if number >= _MILLIS_FROM else number
    else:
        seconds = datetime.fromisoformat(value.replace("z", "Z").replace("t", "T")).timestamp()
    return min(max(seconds, 0.0), _LATEST_SECONDS)


def parse_step(text: str) -> float:
    """Seconds from `5s`, `1m`, `1h30m` or a bare number of seconds (STEP_PATTERN): a step under a millisecond
    is answered at a millisecond, one longer than every time the API holds at that length."""
    if not _STEP_FORM.fullmatch(text):
        raise BadParameter("step", f"{text[:80]!r} is not a duration such as 5s, 1m or 30 (seconds), not zero")
    step = parse_duration_seconds(text.strip())
    return min(max(step, _SHORTEST_STEP_SECONDS), _LONGEST_STEP_SECONDS)


def parse_metrics(values: Iterable[str], default: Sequence[str]) -> tuple[str, ...]:
    """`metric=` values, repeatable and comma-separated; unknown names are refused."""
    names: list[str] = []
    for value in values:
        for part in value.split(","):
            name = part.strip().removeprefix("gpuwm_")
            if not name:
                raise BadParameter("metric", "is empty; give a metric name such as gpu_utilization_percent")
            if name not in METRIC_INDEX:
                raise BadParameter(
                    "metric", f"unknown metric {part.strip()!r}; known: {', '.join(METRIC_NAMES)}"
                )
            if name not in names:
                names.append(name)
    return tuple(names) if names else tuple(default)


def parse_breakdown(text: str | None) -> Breakdown | None:
    if text is None:
        return None
    if text not in BREAKDOWNS:
        raise BadParameter("by", f"{text!r} is not one of {', '.join(BREAKDOWNS)}")
    return cast(Breakdown, text)


def parse_bool(parameter: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise BadParameter(parameter, f"{text!r} is not true or false")


def choose_range(
    start: float | None,
    end: float | None,
    step: float | None,
    default_start: float,
    default_end: float,
) -> tuple[float, float, float]:
    """Fill defaults; without an explicit step a long default range gets a coarser step so it fits the limit."""
    chosen_end = default_end if end is None else end
    chosen_start = default_start if start is None else start
    if start is None and chosen_start > chosen_end:
        chosen_start = chosen_end
    if end is None and chosen_end < chosen_start:
        chosen_end = chosen_start
    if chosen_end < chosen_start:
        raise BadParameter("end", f"is before start ({chosen_end} < {chosen_start})")
    if step is None:
        step = DEFAULT_STEP_SECONDS
        span = chosen_end - chosen_start
        if span / step + 1 > MAX_POINTS_PER_SERIES:
            step = float(math.ceil(span / (MAX_POINTS_PER_SERIES - 1)))
    points = int((chosen_end - chosen_start) // step) + 1
    if points > MAX_POINTS_PER_SERIES:
        raise BadParameter(
            "step",
            f"{points} points per series exceeds the limit of {MAX_POINTS_PER_SERIES}; "
            "use a coarser step or a shorter range",
        )
    return chosen_start, chosen_end, step


def encode_continue(key: Sequence[str | float | bool]) -> str:
    """The opaque `continue` token of a list cut at `limit`: the sort key of the page's last item, so the next
    page starts after it even where items came or went in between."""
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode().rstrip("=")


def decode_continue(token: str, read: Callable[[Any], _Key]) -> _Key:
    """The sort key `token` carries, as `read` makes it of the decoded JSON; a token this API did not give
    (not base64 JSON, or a key `read` refuses with ValueError, TypeError or LookupError) is refused by name."""
    try:
        return read(json.loads(base64.urlsafe_b64decode((token + "=" * (-len(token) % 4)).encode())))
    except (ValueError, TypeError, LookupError, binascii.Error):
        raise BadParameter(
            "continue", f"{token[:40]!r} is not a token this API gave; pass the `continue` of the previous page"
        ) from None
