"""Which failed calls to retry, how long the server asked us to wait, and what to tell the user."""

from __future__ import annotations

import email.utils
import time

from evolve.llm._litellm import litellm

MAX_RETRY_AFTER_S = 600.0
_RETRY_STATUS = {408, 409, 429}


def retry_after(exc: BaseException) -> float | None:
    """Seconds the server asked us to wait (Retry-After / retry-after-ms headers), if any."""
    headers: dict[str, str] = {}
    try:
        response = getattr(exc, "response", None)
        if response is not None and getattr(response, "headers", None) is not None:
            headers.update({k.lower(): v for k, v in response.headers.items()})
    except Exception:  # some exceptions build their response lazily and may fail
        pass
    headers.update(
        {k.lower(): v for k, v in (getattr(exc, "litellm_response_headers", None) or {}).items()}
    )
    if "retry-after-ms" in headers:
        try:
            return float(headers["retry-after-ms"]) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())


def classify(exc: BaseException) -> str:
    """``retry`` (rate limit, timeout, connection, 5xx), ``fatal`` (auth, unknown model, no credit) or ``fail``."""
    lit = litellm()
    if isinstance(exc, TimeoutError | lit.Timeout | lit.RateLimitError | lit.APIConnectionError):
        return "retry"
    if isinstance(exc, lit.AuthenticationError | lit.PermissionDeniedError | lit.NotFoundError):
        return "fatal"
    status = getattr(exc, "status_code", None)
    if status == 402:
        return "fatal"
    if isinstance(status, int) and (status in _RETRY_STATUS or status >= 500):
        return "retry"
    return "fail"


def describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError) and not str(exc):
        return "TimeoutError: no answer within llm.timeout_s"
    return f"{type(exc).__name__}: {str(exc).strip()[:2000]}"


def fix_for(model: str, exc: BaseException, setting: str = "llm.model") -> str:
    """What to do about a fatal error of ``model``, chosen by ``setting`` (its ``*api_base`` beside it)."""
    lit = litellm()
    if isinstance(exc, lit.AuthenticationError):
        try:
            keys = lit.validate_environment(model).get("missing_keys") or []
        except Exception:
            keys = []
        named = f" ({' or '.join(keys)})" if keys else ""
        return f"the provider refused the API key{named}; export a valid key and resume the run"
    if isinstance(exc, lit.NotFoundError):
        base = setting.replace("model", "api_base")
        return f"the model does not exist at this provider or server; check {setting} (and {base})"
    if isinstance(exc, lit.PermissionDeniedError):
        return f"the account has no access to this model; choose another {setting}"
    return "the account has no credit left; add credit and resume the run"
