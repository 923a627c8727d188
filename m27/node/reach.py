"""Whether a Prefect API answers: the node service's own server before it says ready, and
a lab's server (PREFECT_API_URL) before `m27 run` starts a run on it.

Plain ``urllib`` (no Prefect import): finding the service stays cheap for a warm `m27 run`.
"""

from __future__ import annotations

__all__ = ["healthy", "unreachable"]


def healthy(url: str, timeout: float = 2.0) -> bool:
    """True when the Prefect API at `url` answers its health check."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (OSError, ValueError):
        return False


def unreachable(url: str, timeout: float = 10.0) -> str | None:
    """Why nothing answers at the Prefect API `url` (connection refused, no such host, no
    answer within `timeout`), or None. Any HTTP answer counts as an answer, and so does a
    TLS failure: Prefect's own settings may trust a certificate this check does not."""
    import ssl
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout).close()
    except urllib.error.HTTPError:
        return None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, ssl.SSLError):
            return None
        return (reason.strerror if isinstance(reason, OSError) else None) or str(reason)
    except TimeoutError:
        return f"no answer in {timeout:g} s"
    except (OSError, ValueError):  # a malformed URL or a dropped connection: Prefect says
        return None
    return None
