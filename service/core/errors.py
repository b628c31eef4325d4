"""Domain errors: each carries an HTTP status and a stable code; one handler renders them."""

from __future__ import annotations


class ConfigError(Exception):
    """Bad configuration found at start-up; the message names the setting."""


class DomainError(Exception):
    """An error the API reports as {"error": code, "detail": message}."""

    status_code = 400
    code = "bad_request"

    def __init__(self, detail: str, *, field: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field


class NotFound(DomainError):
    status_code = 404
    code = "not_found"


class Conflict(DomainError):
    status_code = 409
    code = "conflict"


class InvalidSpec(DomainError):
    status_code = 422
    code = "invalid_spec"


class Unauthorized(DomainError):
    status_code = 401
    code = "unauthorized"


class Forbidden(DomainError):
    status_code = 403
    code = "forbidden"


class PayloadTooLarge(DomainError):
    status_code = 413
    code = "payload_too_large"


class QuotaExceeded(DomainError):
    """A token has used up one of its PARITY_TOKEN_* quotas; the detail names the setting."""

    status_code = 429
    code = "quota_exceeded"


class ServiceUnavailable(DomainError):
    status_code = 503
    code = "service_unavailable"


class TooManyRequests(DomainError):
    """A cap is reached; the client should retry after `retry_after` seconds."""

    status_code = 429
    code = "too_many_requests"

    def __init__(self, detail: str, *, field: str | None = None, retry_after: int = 30) -> None:
        super().__init__(detail, field=field)
        self.retry_after = retry_after
