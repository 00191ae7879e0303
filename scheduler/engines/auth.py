"""The key an engine accepts: only the platform may call an engine's API.

Every engine the platform starts gets a key of its own in `VLLM_API_KEY` (launch.py), and
refuses, with 401, any call that does not bear it, on every route but /health: vLLM checks
its API prefixes (/v1, ...) and the platform's gate (engine_side/gpushare_engine_gate.py,
put in through vLLM's `--middleware`) every other route, /invocations, /tokenize, /metrics
and whatever a later vLLM adds among them. Anything that reaches an engine's port, on the
node or in the cluster, cannot go around the platform's keys, quotas, fair queue and
ledger, nor read its metrics. The key travels in the environment, never on the command
line, which every local user can read in /proc/<pid>/cmdline.

The key is derived, not stored: an HMAC of the engine's address under the platform's
SECRET_KEY. A database dump does not give it away, and every process of the platform (the
web that streams, the workers, the supervisor that starts the engine) computes the same key
from the address it calls, with nothing passed between them. Changing SECRET_KEY changes
every engine's key: engines started before must be restarted (until then they refuse the
platform, and calls to them fail as calls to an engine that is down).

/health answers anyone (what watches a node from outside asks it); what keeps even that
from other machines is where the engine listens (127.0.0.1 unless an operator sets an
address) and, in a cluster, the network (docs/SECURITY.md). Why the key is derived:
docs/decisions/0004-engine-keys-derived-from-the-secret.md.
"""

from __future__ import annotations

from django.utils.crypto import salted_hmac

KEY_SALT = "gpushare.engines.api-key"


def engine_api_key(base_url: str) -> str:
    """The key of the engine at `base_url` (its `Engine.base_url`)."""
    return salted_hmac(KEY_SALT, base_url.rstrip("/"), algorithm="sha256").hexdigest()


def engine_auth_headers(base_url: str) -> dict[str, str]:
    """What each call to the engine at `base_url` carries."""
    return {"Authorization": f"Bearer {engine_api_key(base_url)}"}
