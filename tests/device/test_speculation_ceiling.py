"""The ceiling tools/speculation_bench.py prints beside each task: the fewest passes, priced with a
board's pass costs, in which a drafter that copies from the context could produce the answer if it
knew it. It bounds what any prompt-lookup drafting rule can reach on that answer."""

import importlib.util

import pytest
from conftest import REPO

spec = importlib.util.spec_from_file_location("speculation_bench", REPO / "tools" / "speculation_bench.py")
speculation_bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(speculation_bench)
ceiling = speculation_bench.ceiling

FLAT = [1.0, 1.0, 1.0, 1.0]  # passes of any length cost one: the ceiling counts passes saved
HOST_LIKE = [1.0, 1.72, 2.29, 2.83]


def test_an_answer_that_copies_nothing_has_no_room():
    assert ceiling([1, 2, 3], [10, 11, 12, 13, 14], FLAT, 3) == 1.0


def test_an_answer_that_copies_the_prompt_takes_the_longest_drafts_the_limit_allows():
    prompt = [5, 6, 7, 8, 9, 10, 11, 12]
    # after 5 (from the prefill), 6 7 8 9 10 11 12: drafts of 3 and their next tokens, 4 + 3 tokens
    assert ceiling(prompt, prompt, FLAT, 3) == pytest.approx(7 / 2)


def test_an_edit_ends_a_pass_and_the_copy_goes_on_after_it():
    prompt = [1, 2, 3, 4, 5, 6, 7]
    answer = [1, 2, 3, 99, 5, 6, 7]  # 99 is in no context: it can only be a pass's own token
    # the pass after 1 drafts 2 3 and yields 99 as its next token; the next drafts 5 6 and yields 7
    assert ceiling(prompt, answer, FLAT, 3) == pytest.approx(6 / 2)


def test_the_answer_so_far_is_context_too():
    answer = [40, 41, 42, 43, 40, 41, 42, 43]
    # 41 42 43 are new; from the second 40 on, the answer's own start is copied
    assert ceiling([1], answer, FLAT, 3) == pytest.approx(7 / 4)


def test_passes_are_priced_and_a_draft_is_made_only_where_it_pays():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    # with one draft token worth 1.72 passes and never more than 2 tokens, drafting 2 3 ...
    assert ceiling(prompt, prompt, HOST_LIKE, 1) == pytest.approx(8 / (4 * 1.72))
    # after 0: one pass drafts 7 and yields 7 8 (1.72, against 2.0 for two single passes); 50 and
    # 51 copy nothing and take a pass each
    assert ceiling([7, 8], [0, 7, 8, 50, 51], HOST_LIKE, 1) == pytest.approx(4 / (1.72 + 1.0 + 1.0))
