"""Bearer and join tokens checked for strength at start: a token that opens the admin routes, the rank join
(where the head unpickles what a rank sends) or the replica door must be hard to guess.

A token's strength is estimated as its length times the bits one character of its alphabet carries: 4 for
hex digits, 6 for base64's letters, digits, '-', '_', '+' and '/', 6.5 for any other printable character. At
least `MIN_TOKEN_BITS` are required (32 hex digits, 22 base64 characters: `secrets.token_urlsafe(16)` or more),
with at least `MIN_DISTINCT` different characters, so a repeated pattern never passes for a random token.
"""

from __future__ import annotations

import math
import stat
import string
from pathlib import Path

from agentrl.foundation.errors import ConfigurationError

MIN_TOKEN_BITS = 128
MIN_DISTINCT = 8
_HEX = frozenset(string.hexdigits)
_BASE64 = frozenset(string.ascii_letters + string.digits + "-_+/=")
GENERATE = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
"""The command that makes a good token, named in every refusal."""


def estimated_bits(token: str) -> float:
    """The token's strength in bits, as the module's docstring estimates it."""
    characters = set(token)
    if characters <= _HEX and not (characters & set("abcdef") and characters & set("ABCDEF")):
        per_character = 4.0
    elif characters <= _BASE64:
        per_character, token = 6.0, token.rstrip("=")
    else:
        per_character = math.log2(95)
    return len(token) * per_character


def check_token_strength(token: str, name: str) -> str:
    """`token` if it is strong enough; a ConfigurationError naming `name` and how to make one otherwise."""
    bits = estimated_bits(token)
    if bits < MIN_TOKEN_BITS or len(set(token)) < MIN_DISTINCT:
        raise ConfigurationError(
            f"{name} is too weak to guard this door (about {bits:.0f} bits from {len(token)} characters, "
            f"{len(set(token))} different; at least {MIN_TOKEN_BITS} bits and {MIN_DISTINCT} different characters "
            f"are required): set it to a random token, e.g. from {GENERATE}"
        )
    return token


def check_private_file(path: Path) -> None:
    """A ConfigurationError when the secret file `path` can be read or written by others than its owner."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise ConfigurationError(
            f"{path} holds a secret token but its mode is {mode:04o} (others can read it): run `chmod 600 {path}`, "
            "or delete it to have a new token generated"
        )
