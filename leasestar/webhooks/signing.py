"""The headers that let a receiver check a delivery came from us, in either form.

`standard` (Standard Webhooks, spec/standard-webhooks.md): `webhook-id` (the event id,
the same on every retry: the receiver's key for dropping duplicates),
`webhook-timestamp` (Unix seconds of this attempt) and `webhook-signature`:
`v1,<base64 HMAC-SHA256 of "id.timestamp.body">` under the base64 key of a `whsec_`
secret, one per secret that signs, space-separated, so a receiver holding either the
new or the previous secret accepts a delivery during a rotation's grace period.

`propexo` (Propexo's webhooks): `propexo-signature`, the hex HMAC-SHA256 of the body
under the secret's UTF-8 bytes. The form has room for one signature, made with the
current secret; during a rotation's grace period `propexo-signature-previous` carries
the one made with the previous secret, for a receiver that has not switched yet.
Neither form signs a timestamp; the event id is sent as `webhook-id` there too.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence

from leasestar.webhooks.subscriptions import STANDARD_SECRET_PREFIX


def standard_key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(STANDARD_SECRET_PREFIX))


def standard_signature(secret: str, event_id: str, timestamp: int, body: bytes) -> str:
    signed = b"%s.%d.%s" % (event_id.encode(), timestamp, body)
    digest = hmac.new(standard_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def propexo_signature(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def signed_headers(
    signing: str, secrets: Sequence[str], event_id: str, timestamp: int, body: bytes
) -> dict[str, str]:
    """The headers of one attempt; `secrets` are the current one first, then the previous
    one while it still signs."""
    headers = {"content-type": "application/json", "webhook-id": event_id}
    if signing == "standard":
        headers["webhook-timestamp"] = str(timestamp)
        headers["webhook-signature"] = " ".join(
            standard_signature(secret, event_id, timestamp, body) for secret in secrets
        )
    else:
        headers["propexo-signature"] = propexo_signature(secrets[0], body)
        if len(secrets) > 1:
            headers["propexo-signature-previous"] = propexo_signature(secrets[1], body)
    return headers
