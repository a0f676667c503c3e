"""Webhooks (issue 28): subscriptions, the outbox every write fills, signing and delivery.

`outbox.py` records events in the writer's transaction; `deliverer.py` (run by one
worker of `leasestar serve`) sends them, signed as `signing.py` says, retried as
`retries.py` says, and records what happened through `ledger.py`.
"""
