"""Fencing tokens that fence (issue #38 item 2): a token is its grant's counter (the order a fencing token must
keep) with 32 random bits below it, so seeing one holder's token tells nothing of the next. In-process head."""

from __future__ import annotations

from pathlib import Path

import pytest
from headless import InProcessHead

from orchestrator.core.errors import StaleFencingTokenError
from orchestrator.core.lease import TOKEN_RANDOM_BITS, key_digest, make_token, token_counter


def test_a_token_keeps_its_counters_order_and_its_low_bits_need_the_heads_secret() -> None:
    a, b = b"a" * 32, b"b" * 32
    tokens = [make_token(n, "l", a) for n in (1, 2, 2**31 - 1)]
    assert [token_counter(t) for t in tokens] == [1, 2, 2**31 - 1]
    assert tokens[0] < tokens[1] < tokens[2] < 2**63  # a later grant's token is larger; a signed 64-bit int
    assert make_token(5, "l", a) == make_token(5, "l", a)  # the head derives it again after a restart
    assert len({make_token(5, lid, a) for lid in map(str, range(64))}) == 64  # another lease: other low bits
    assert make_token(5, "l", a) != make_token(5, "l", b)  # another secret: other low bits


def test_the_journal_keeps_no_token_and_a_restored_head_derives_each_again(tmp_path: Path) -> None:
    """The journal is in the GCS KV, which any driver of the cluster can read (``ray.experimental.internal_kv``):
    it held every lease's token, and every job hand-out's copy. Now it keeps the counter; the head, which alone
    has its secret, makes the token again when it restores, and the holder's token still works."""
    import json

    from orchestrator.control.service import HeadService

    head = InProcessHead(workdir=tmp_path)
    try:
        head.request_lease({"lease_id": "l", "request": "1", "requester_digest": key_digest("k")})
        token = head.wait_lease("l", 5, "k")["fencing_token"]
        stored = json.dumps({k: head.store.get(k) for k in head.store.keys("")})
        assert str(token) not in stored and str(token & 0xFFFFFFFF) not in stored
        again = HeadService(head.settings, head.config, head.store, head.runner, head.cluster,
                            token_secret=head.service.ctl.ledger.token_secret)
        assert again.ctl.ledger.get("l").lease.fencing_token == token
        other = HeadService(head.settings, head.config, head.store, head.runner, head.cluster,
                            token_secret=b"x" * 32)  # a head without the secret derives no one's token
        assert other.ctl.ledger.get("l").lease.fencing_token != token
    finally:
        head.close()


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
