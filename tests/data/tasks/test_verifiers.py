"""The verifiable tasks: seeded generation, disjoint splits, exact verifiers and the reward from token ids."""

from fractions import Fraction

import pytest
import torch

from tcsm.data.base import DataError
from tcsm.data.tasks import EOS, TASKS, TaskReward, make_task, task_reward
from tcsm.data.tasks.countdown import evaluate, parse
from tcsm.data.tasks.sudoku import solutions, valid_grids

SMALL = {"sudoku": {}, "countdown": {"count": 4}, "addition": {"digits": 2}}


@pytest.mark.parametrize("name", sorted(TASKS))
def test_generation_is_a_function_of_the_seed(name):
    task = make_task(name)
    assert task.examples("train", 30, seed=3) == task.examples("train", 30, seed=3)
    assert task.examples("train", 30, seed=3) != task.examples("train", 30, seed=4)
    assert task.examples("test", 30, seed=3) != task.examples("train", 30, seed=3)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_train_and_test_are_disjoint_up_to_the_task_symmetries(name):
    task = make_task(name, **SMALL[name])
    train = {task.split_key(e.prompt) for e in task.examples("train", 600, seed=0)}
    test = {task.split_key(e.prompt) for e in task.examples("test", 200, seed=5)}
    assert len(test) == 200 and not train & test


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_sequence_has_the_fixed_lengths_and_an_eos(name):
    task = make_task(name, **SMALL[name])
    tok = task.tokenizer()
    for ex in task.examples("train", 200, seed=1):
        text = task.text(ex)
        assert len(ex.prompt) == task.prompt_len and 1 <= len(ex.answer) <= task.answer_len
        assert len(tok.encode(text)) == task.seq_len == len(text) and text.endswith(EOS)
        assert EOS not in ex.prompt + ex.answer


@pytest.mark.parametrize("name", sorted(TASKS))
def test_the_verifier_accepts_every_reference_answer_and_rejects_corrupted_ones(name):
    task = make_task(name, **SMALL[name])
    g = torch.Generator().manual_seed(0)
    for ex in task.examples("test", 200, seed=2):
        assert task.score_text(ex.prompt, ex.answer + EOS + "garbage after the end") == 1.0
        assert task.score_text(ex.prompt, "") == 0.0
        assert task.score_text(ex.prompt, ex.answer[:-1]) == 0.0 or name == "addition"
        i = int(torch.randint(len(ex.answer), (), generator=g))
        for c in task.chars:
            wrong = ex.answer[:i] + c + ex.answer[i + 1 :]
            if wrong != ex.answer and task.score_text(ex.prompt, wrong) == 1.0:
                # another answer that solves the problem: only countdown admits several (checked exactly)
                numbers, target = task.numbers_and_target(ex.prompt)
                value, literals = parse(wrong)
                assert name == "countdown" and value == target and sorted(literals) == sorted(numbers)


def test_sudoku_has_288_grids_and_unique_puzzles():
    assert len(valid_grids()) == 288 and len(set(valid_grids())) == 288
    task = make_task("sudoku")
    for ex in task.examples("train", 100, seed=0):
        assert solutions(ex.prompt[:16]) == [ex.answer]
    ex = task.examples("train", 1, seed=0)[0]
    grid = ex.answer
    swapped = grid[1] + grid[0] + grid[2:]  # a row stays a permutation, its columns do not
    assert not task.check(ex.prompt, swapped)
    blank = ex.prompt.index("0")
    other = next(g for g in valid_grids() if g[blank] != grid[blank])
    assert not task.check(ex.prompt, other) or solutions(ex.prompt[:16]) != [grid]


def test_countdown_evaluates_exactly_without_eval():
    assert evaluate("1/3+1/3+1/3") == 1
    assert evaluate("8/(3-8/3)") == 24  # needs exact fractions: 8/3 is not a float
    assert evaluate("2*3+4") == 10 and evaluate("2*(3+4)") == 14 and evaluate("9-3-2") == 4 and evaluate("9-(3-2)") == 8
    assert evaluate("8/4/2") == 1 and evaluate("8/(4/2)") == 4
    assert parse("(1+2)*3")[1] == [1, 2, 3]
    for bad in ("", "1+", "-1+2", "(1+2", "1+2)", "1 + 2", "01+2", "__import__('os')", "1**2", "2(3)"):
        with pytest.raises(ValueError):
            parse(bad)
    with pytest.raises(ZeroDivisionError):
        evaluate("1/(2-2)")
    task = make_task("countdown")
    assert task.check("3,5,7:26=", "3*7+5") and task.check("3,5,7:26=", "5+(7*3)")
    assert not task.check("3,5,7:26=", "3*7+5+0")  # a number that was not given
    assert not task.check("3,5,7:26=", "7*3+5*1")
    assert task.score_text("3,5,7:26=", "3*7+") == 0.0 and task.score_text("2,2,9:10=", "9/(2-2)+2") == 0.0
    assert not task.check("2,2,9:13=", "2+2+9+0") and task.check("2,2,9:13=", "2+2+9")
    assert Fraction(evaluate("7/2")) == Fraction(7, 2)
    import ast
    import inspect

    from tcsm.data.tasks import countdown

    calls = {n.func.id for n in ast.walk(ast.parse(inspect.getsource(countdown)))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}  # fmt: skip
    assert not calls & {"eval", "exec", "compile", "__import__"}


def test_addition_accepts_any_zero_padding_up_to_the_answer_length():
    task = make_task("addition", digits=3)
    assert task.check("123+045=", "168") and task.check("123+045=", "0168")
    assert not task.check("123+045=", "00168") and not task.check("123+045=", "169") and not task.check("123+045=", "1a8")


@pytest.mark.parametrize("name", sorted(TASKS))
def test_reward_reads_prompt_and_completion_from_ids(name):
    task = make_task(name, **SMALL[name])
    tok = task.tokenizer()
    examples = task.examples("test", 20, seed=0)
    x = torch.tensor([tok.encode(task.text(e)) for e in examples])
    reward = task_reward(name, **SMALL[name])
    assert torch.equal(reward(x), torch.ones(20))
    P = task.prompt_len
    shuffled = torch.cat([x[:, :P], x.roll(1, 0)[:, P:]], 1)  # answers to other prompts
    expected = [task.score_text(task.text(a)[:P], task.text(b)[P:]) for a, b in zip(examples, examples[-1:] + examples[:-1])]
    assert reward(shuffled).tolist() == expected and sum(expected) < 20
    masked = x.clone()
    masked[:, P] = tok.vocab_size  # a mask left unfilled before the end of the answer
    assert reward.score(masked[:, :P], masked[:, P:]).sum() == 0


def test_reward_refuses_a_tokenizer_that_cannot_write_the_task():
    with pytest.raises(DataError, match="cannot write task countdown"):
        TaskReward(make_task("countdown"), decode=lambda ids: "".join("0123456789\n"[i] for i in ids), vocab_size=11)
    # a wider character vocabulary (other ids) works through its own decode
    chars = "\nabc0123456789+="
    reward = task_reward("addition", decode=lambda ids: "".join(chars[i] for i in ids), vocab_size=len(chars), digits=2)
    x = torch.tensor([[chars.index(c) for c in "12+34=046\n"]])
    assert reward(x).tolist() == [1.0]


def test_a_split_smaller_than_asked_is_refused_in_one_line(monkeypatch):
    from tcsm.data.tasks import base

    monkeypatch.setattr(base, "STALL", 500)  # the same rule, sooner
    task = make_task("countdown", count=2, max_number=4)  # a handful of problems in all
    with pytest.raises(DataError, match=r"found only \d+ distinct train problems of the 50"):
        task.examples("train", 50)
