"""Where speculative decoding's drafts come from and how long they are (firmware_src/app/speculate.c,
driven alone by tests/c/speculate_harness.c): what followed the earlier occurrence of the context's
longest suffix, or of a shorter one just past where the last copy stopped, never a single token's
match, and as long as makes the most expected tokens per cost of the pass, from what drafts after
matches of that kind did before."""

import subprocess

import pytest
from c_builds import gcc
from conftest import REPO

from generator.boards import load_board

APP = REPO / "firmware_src" / "app"


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    exe = gcc(
        tmp_path_factory.mktemp("speculate") / "speculate_harness",
        f"-I{APP}",
        REPO / "tests" / "c" / "speculate_harness.c",
        APP / "speculate.c",
        optimize="-O1",
    )

    def draft(*contexts):
        args = [c if isinstance(c, str) else ",".join(map(str, c)) for c in contexts]
        out = subprocess.run([str(exe), *args], check=True, capture_output=True, text=True).stdout
        return [[int(t) for t in line.split(",")] if line else [] for line in out.splitlines()]

    return draft


def test_the_draft_follows_the_longest_earlier_match_not_the_latest(drafts):
    # The context ends in "1 5 6 7": it occurred first, followed by 8 9 2 9; "5 6 7" occurred later,
    # followed by 30.
    context = [1, 5, 6, 7, 8, 9, 2, 9, 5, 6, 7, 30, 3, 1, 5, 6, 7]
    assert drafts(context) == [[8, 9, 2, 9, 5, 6, 7]]


def test_of_equally_long_matches_the_latest_drafts(drafts):
    assert drafts([3, 4, 11, 12, 3, 4, 21, 22, 9, 3, 4]) == [[21, 22, 9, 3, 4]]


def test_a_single_token_match_drafts_nothing(drafts):
    assert drafts([7, 1, 2, 3, 9, 7]) == [[]]
    assert drafts([1, 2, 3, 4], [4]) == [[], []]


def test_a_draft_never_runs_past_the_context(drafts):
    # matched by 4 (overlapping itself): the draft stops where the context does
    assert drafts([1, 2, 1, 2, 1, 2]) == [[1, 2]]


HOST = "cost=" + ",".join(map(str, load_board("host").speculate_pass_cost))  # targets/host.toml's
COPYING = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 5, 6, 7, 8]  # "5 6 7 8" again: a copy?


def test_where_passes_cost_a_short_match_drafts_nothing_and_a_long_one_drafts_all_it_can(drafts):
    # a 2-token match is taken for a copy 2 times in 3: a 2-token pass (1.72) would not pay for it
    assert drafts(HOST, [1, 2, 30, 31, 32, 33, 34, 9, 1, 2]) == [[]]
    # a 4-token match, 4 times in 5: the longest draft makes the most tokens per cost
    assert drafts(HOST, COPYING) == [[9, 10, 11, 12, 13, 14, 15]]


def test_drafts_after_matches_that_long_being_refused_stop_the_drafting(drafts):
    refused = ["taken=0"] * 3
    elsewhere = list(range(60, 70)) + COPYING  # the same match, far from where the refused copy was
    assert drafts(HOST, COPYING, *refused, elsewhere) == [[9, 10, 11, 12, 13, 14, 15], []]
    # drafts that were taken whole keep it going
    assert drafts(HOST, COPYING, "taken=7", COPYING) == [[9, 10, 11, 12, 13, 14, 15]] * 2


def test_free_passes_draft_whatever_follows_the_match(drafts):
    assert drafts([1, 2, 30, 31, 32, 33, 34, 9, 1, 2]) == [[30, 31, 32, 33, 34, 9, 1]]


SOURCE = list(range(10, 30))  # a text being copied, with its 6th token (15) changed to 99


def test_after_an_edit_a_short_match_just_past_the_copy_resumes_it(drafts):
    copied = SOURCE + [10, 11, 12, 13]
    after_edit = copied + [14, 99, 16]  # 14 taken, 15 refused: the edit
    resumed = after_edit + [17]  # "16 17": a 2-token match just past where the copy stopped
    assert drafts(HOST, copied, "taken=1", after_edit, resumed) == [
        [14, 15, 16, 17, 18, 19, 20],
        [],
        [18, 19, 20, 21, 22, 23, 24],
    ]
    # the same 2-token match with no copy before it is not worth a pass of several tokens
    assert drafts(HOST, resumed) == [[]]


def test_a_draft_refused_from_its_first_token_leaves_no_copy_to_resume(drafts):
    copied = SOURCE + [10, 11, 12, 13]
    assert drafts(HOST, copied, "taken=0", copied + [99, 15, 16]) == [[14, 15, 16, 17, 18, 19, 20], []]
