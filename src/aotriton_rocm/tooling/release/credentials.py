"""Upload credentials of ``aotriton-rocm release``: TWINE_USERNAME and
TWINE_PASSWORD from the environment, else the keyring (the lookup twine does).
They are passed to twine in its environment and never printed."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

__all__ = ["CREDENTIAL_VARS", "Credentials", "find_credentials"]

CREDENTIAL_VARS = ("TWINE_USERNAME", "TWINE_PASSWORD")


@dataclass
class Credentials:
    username: str
    password: str = field(repr=False)
    source: str = ""

    def env(self) -> Dict[str, str]:
        """The environment of an upload: twine reads these itself, so the
        password is never on a command line."""
        return {"TWINE_USERNAME": self.username, "TWINE_PASSWORD": self.password}


def find_credentials(service: Optional[str]) -> Tuple[Optional[Credentials], str]:
    """Upload credentials: TWINE_USERNAME and TWINE_PASSWORD from the
    environment; what is missing there from the keyring (``keyring`` package,
    the same lookup twine does: service = the index URL). Returns
    (credentials or None, where they came from / why there are none)."""
    user = os.environ.get("TWINE_USERNAME") or None
    password = os.environ.get("TWINE_PASSWORD") or None
    if user and password:
        return Credentials(user, password, "TWINE_USERNAME and TWINE_PASSWORD from the environment"), ""
    why_not = "TWINE_USERNAME and TWINE_PASSWORD are not both set"
    if not service:
        return None, why_not + " (and a keyring lookup needs --index-url)"
    try:
        import keyring
        from keyring.errors import KeyringError
    except ImportError:
        return None, why_not + " and the keyring package is not installed (pip install keyring)"
    try:
        if not user:
            cred = keyring.get_credential(service, None)
            if cred is not None and cred.username:
                user = cred.username
                password = password or cred.password
        if user and not password:
            password = keyring.get_password(service, user)
    except KeyringError as e:
        return None, f"{why_not}, and the keyring is unusable: {type(e).__name__}: {e}"
    except Exception as e:  # a broken keyring backend must not take the release down
        return None, f"{why_not}, and the keyring lookup failed: {type(e).__name__}"
    if user and password:
        origin = "the environment" if os.environ.get("TWINE_USERNAME") else "the keyring"
        return Credentials(user, password, f"username from {origin}, password from the keyring "
                                           f"({service})"), ""
    return None, (f"{why_not}, and the keyring has no "
                  + ("password for that user" if user else "credentials")
                  + f" for {service} (`keyring set {service} USERNAME`)")
