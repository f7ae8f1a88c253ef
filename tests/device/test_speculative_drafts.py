"""Where speculative decoding's drafts come from (firmware_src/app/speculate.c, driven alone by
tests/c/speculate_harness.c): what followed the earlier occurrence of the context's longest
suffix, never a single token's match, and no longer than the match."""

import subprocess

import pytest
from conftest import REPO

APP = REPO / "firmware_src" / "app"


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    exe = tmp_path_factory.mktemp("speculate") / "speculate_harness"
    subprocess.run(
        ["gcc", "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{APP}",
         str(REPO / "tests" / "c" / "speculate_harness.c"), str(APP / "speculate.c"), "-o", str(exe)],
        check=True,
    )  # fmt: skip

    def draft(*contexts):
        args = [",".join(map(str, c)) for c in contexts]
        out = subprocess.run([str(exe), *args], check=True, capture_output=True, text=True).stdout
        return [[int(t) for t in line.split(",")] if line else [] for line in out.splitlines()]

    return draft


def test_the_draft_follows_the_longest_earlier_match_not_the_latest(drafts):
    # The context ends in "1 5 6 7": it occurred first, followed by 8 9 2 9; "5 6 7" occurred later,
    # followed by 30.
    context = [1, 5, 6, 7, 8, 9, 2, 9, 5, 6, 7, 30, 3, 1, 5, 6, 7]
    assert drafts(context) == [[8, 9, 2, 9]]


def test_of_equally_long_matches_the_latest_drafts(drafts):
    assert drafts([3, 4, 11, 12, 3, 4, 21, 22, 9, 3, 4]) == [[21, 22]]


def test_a_single_token_match_drafts_nothing(drafts):
    assert drafts([7, 1, 2, 3, 9, 7]) == [[]]
    assert drafts([1, 2, 3, 4], [4]) == [[], []]


def test_a_draft_is_no_longer_than_its_match_nor_runs_past_the_context(drafts):
    # matched by 2 tokens: 2 drafted though 5 followed
    assert drafts([1, 2, 30, 31, 32, 33, 34, 9, 1, 2]) == [[30, 31]]
    # matched by 4 (overlapping itself): the draft stops where the context does
    assert drafts([1, 2, 1, 2, 1, 2]) == [[1, 2]]
