"""Fencing tokens that fence (issue #38 item 2): a token is its grant's counter (the order a fencing token must
keep) with 32 random bits below it, so seeing one holder's token tells nothing of the next. In-process head."""

from __future__ import annotations

from pathlib import Path

import pytest
from headless import InProcessHead

from orchestrator.core.errors import StaleFencingTokenError
from orchestrator.core.lease import TOKEN_RANDOM_BITS, key_digest, make_token, token_counter


def test_a_token_keeps_its_counters_order_and_its_low_bits_are_random() -> None:
    tokens = [make_token(n) for n in (1, 1, 2, 2**31 - 1)]
    assert [token_counter(t) for t in tokens] == [1, 1, 2, 2**31 - 1]
    assert tokens[0] < tokens[2] < tokens[3] < 2**63  # a later grant's token is larger; a signed 64-bit int
    same = {make_token(5) for _ in range(64)}
    assert len(same) == 64  # the same counter never gives the same token twice (2^-32 a pair)


def test_one_holders_token_does_not_name_the_next_grants_token(tmp_path: Path) -> None:
    """The attack the issue proved by hand: tokens were a counter, so a driver that held lease A (token t) could
    release lease B, granted next, with t + 1. Every guess from A's token is refused and B stays granted."""
    head = InProcessHead(workdir=tmp_path)
    try:
        for lid, key in (("mine", "k-mine"), ("theirs", "k-theirs")):
            head.request_lease({"lease_id": lid, "request": "1", "requester_digest": key_digest(key)})
        mine = head.wait_lease("mine", 5, "k-mine")["fencing_token"]
        theirs = head.wait_lease("theirs", 5, "k-theirs")["fencing_token"]
        assert token_counter(theirs) == token_counter(mine) + 1 and theirs != mine + 1
        low = mine & ((1 << TOKEN_RANDOM_BITS) - 1)
        nxt = token_counter(mine) + 1
        for guess in (mine + 1, nxt, nxt << TOKEN_RANDOM_BITS, (nxt << TOKEN_RANDOM_BITS) | low,
                      ((nxt << TOKEN_RANDOM_BITS) | low) + 1):
            with pytest.raises(StaleFencingTokenError) as e:
                head.release("theirs", guess)
            assert str(theirs) not in str(e.value)  # the refusal never shows the real token
        assert head.get_lease("theirs")["state"] == "granted"
        assert head.release("theirs", theirs)["state"] == "released"  # the holder's own token still works
    finally:
        head.close()
