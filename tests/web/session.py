"""Signing a browser context in as the sign-in form does: one exchange of a token for the session cookie."""

from __future__ import annotations

from typing import Any

SESSION_PATH = "/api/v1/auth/session"


def sign_in(context: Any, base_url: str, token: str) -> None:
    """POST the token once through ``context``'s own request client, which shares the context's cookies: every
    page of the context is then signed in, as every tab of a browser is after one sign-in."""
    response = context.request.post(f"{base_url}{SESSION_PATH}", headers={"Authorization": f"Bearer {token}"})
    assert response.status == 201, response.text()
