"""The change feed (``orchestrator.core.changefeed``): what changed since a mark, against a replay of the changes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.changefeed import ChangeFeed


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from("abcdefg"), max_size=40), st.data())
def test_since_a_mark_is_the_keys_whose_last_change_came_after_it_newest_first(changes: list[str], data) -> None:
    feed: ChangeFeed[str] = ChangeFeed()
    last: dict[str, int] = {}  # the replay: key -> the number of its last change (1-based)
    for n, key in enumerate(changes, start=1):
        feed.changed(key)
        last[key] = n
    assert feed.count == len(changes)
    for key in "abcdefgh":
        assert feed.version(key) == last.get(key, 0)
    for mark in {0, len(changes), data.draw(st.integers(0, len(changes) + 1))}:
        assert feed.since(mark) == sorted((k for k, n in last.items() if n > mark), key=lambda k: -last[k])


def test_a_reader_sees_each_change_once_and_a_key_changed_twice_once() -> None:
    feed: ChangeFeed[str] = ChangeFeed()
    mark = feed.count
    for key in ("n1", "n2", "n1"):
        feed.changed(key)
    assert feed.since(mark) == ["n1", "n2"]
    mark = feed.count
    assert feed.since(mark) == []
    feed.changed("n3")
    assert feed.since(mark) == ["n3"]
