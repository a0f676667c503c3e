"""Concurrent requests for the same slow read share one statement (storage.SingleFlight)."""

from __future__ import annotations

import asyncio

import pytest

from leasestar.applicants.storage import SingleFlight


async def test_concurrent_reads_of_one_key_run_once_and_all_get_the_answer() -> None:
    flight = SingleFlight()
    runs = 0
    release = asyncio.Event()

    async def read() -> int:
        nonlocal runs
        runs += 1
        await release.wait()
        return 42

    tasks = [asyncio.create_task(flight.run("k", read)) for _ in range(5)]
    await asyncio.sleep(0)
    release.set()
    assert await asyncio.gather(*tasks) == [42] * 5
    assert runs == 1


async def test_different_keys_and_later_reads_run_again() -> None:
    flight = SingleFlight()
    runs: list[str] = []

    async def read(key: str) -> str:
        runs.append(key)
        await asyncio.sleep(0)
        return key

    assert await asyncio.gather(
        flight.run("a", lambda: read("a")), flight.run("b", lambda: read("b"))
    ) == ["a", "b"]
    assert await flight.run("a", lambda: read("a")) == "a"
    assert runs == ["a", "b", "a"]


async def test_when_the_first_read_fails_the_others_read_themselves() -> None:
    flight = SingleFlight()
    release = asyncio.Event()
    calls = 0

    async def read() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            await release.wait()
            raise RuntimeError("first read failed")
        return 7

    first = asyncio.create_task(flight.run("k", read))
    await asyncio.sleep(0)
    second = asyncio.create_task(flight.run("k", read))
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(RuntimeError, match="first read failed"):
        await first
    assert await second == 7
    assert calls == 2
