"""The backend service's two bearer tokens: the admin token (every route) from AGENTRL_TOKEN or a private file beside
the runs, and the sampling token (/v1 only), chosen or derived one-way from the admin token."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.backend.remote.wire import SAMPLING_TOKEN_ENV, TOKEN_ENV
from agentrl.foundation.errors import ConfigurationError
from agentrl.foundation.files import write_text_atomic
from agentrl.foundation.secret_tokens import check_private_file, check_token_strength

TOKEN_FILE = "backend.token"


@dataclass(frozen=True)
class ServiceTokens:
    """The service's two bearer tokens and where the admin token came from."""

    admin: str = field(repr=False)
    """Opens every route: register, train, log, delete checkpoints, and sampling."""
    sampling: str = field(repr=False)
    """Opens /v1 (sampling, stored tokens) only: what rollouts, judges and agent frameworks hold."""
    source: str
    """AGENTRL_TOKEN or the token file's path."""
    generated: bool
    """Whether the admin token was generated (and saved) by this start."""


def sampling_token_for(admin: str) -> str:
    """The sampling token derived from the admin token (one-way: holding it reveals nothing of the admin token)."""
    digest = hmac.new(admin.encode(), b"agentrl sampling token", hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def service_tokens(runs_dir: Path) -> ServiceTokens:
    """The admin token from `AGENTRL_TOKEN`, else the one saved beside the runs ({runs_dir}/backend.token,
    mode 0600), else a new one saved there; the sampling token from `AGENTRL_SAMPLING_TOKEN`, else derived.
    A chosen token weaker than 128 bits, or a token file others can read, is a ConfigurationError naming the fix."""
    admin, source, generated = "", TOKEN_ENV, False
    if token := os.environ.get(TOKEN_ENV, "").strip():
        admin = check_token_strength(token, TOKEN_ENV)
    elif (path := runs_dir / TOKEN_FILE).exists():
        check_private_file(path)
        admin, source = check_token_strength(path.read_text().strip(), f"the token in {path}"), str(path)
    else:
        admin, source, generated = secrets.token_urlsafe(32), str(path), True
        write_text_atomic(path, admin + "\n", mode=0o600)
    if chosen := os.environ.get(SAMPLING_TOKEN_ENV, "").strip():
        check_token_strength(chosen, SAMPLING_TOKEN_ENV)
    sampling = chosen or sampling_token_for(admin)
    if sampling == admin:
        raise ConfigurationError(f"{SAMPLING_TOKEN_ENV} must differ from the admin token ({TOKEN_ENV})")
    return ServiceTokens(admin, sampling, source, generated)
