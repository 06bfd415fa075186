"""Suspension tokens: a fresh one for each suspension, stored only as its hash."""

from __future__ import annotations

import hashlib
import secrets


def new_token() -> str:
    """A suspension token: 256 random bits, URL-safe. Never starts with "-", so it can be
    passed to a command line as an argument."""
    while True:
        token = secrets.token_urlsafe(32)
        if not token.startswith("-"):
            return token


def hash_token(token: str) -> str:
    """The SHA-256 of a token: the only form of it that is stored."""
    return hashlib.sha256(token.encode()).hexdigest()
