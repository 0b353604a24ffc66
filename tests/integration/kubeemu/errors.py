"""The emulator's one error type: an API failure, answered as a metav1.Status."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An API failure answered as a metav1.Status."""

    def __init__(self, code: int, reason: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.retry_after = code, reason, message, retry_after

    def status(self) -> dict[str, Any]:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": self.message,
                "reason": self.reason, "code": self.code}
