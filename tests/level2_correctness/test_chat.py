"""Level 2 through the chat endpoint: chat goldens (token streams and the reasoning/content/tool split),
zero harmony parse errors, and task accuracy against a stored floor.

Goldens: goldens/<model>/<platform>/<config>/chat.json and tasks.json (--force-regen). The stream rule is
level 2's (harness/correctness/logprobs.py); when a stream matches its golden token for token, the parsed fields must
match exactly too. Task accuracy: the embedded model's trained task, or any JSONL task set for real
weights (harness/correctness/chat.py `load_tasks`); a harmony parse error counts as a wrong answer.
"""
import hashlib

import pytest

from harness.correctness.chat import (
    accuracy_floor,
    ask,
    chat_golden_data,
    chat_problems,
    check_chat_golden,
    check_tasks_golden,
    load_chat_workload,
    load_tasks,
    run_tasks,
    structure_problems,
)

pytestmark = [pytest.mark.level2, pytest.mark.server]


@pytest.fixture(scope="session")
def chat_workload():
    return load_chat_workload()


@pytest.fixture(scope="session")
def chat_answers(server, suite, chat_workload):
    if not suite.model.has_real_weights:
        pytest.skip(f"{suite.model.alias} has dummy weights: its answers are meaningless")
    client = server.client()
    return {c.name: ask(client, c.messages, chat_workload.max_tokens, c.tools, chat_workload.top_k)
            for c in chat_workload.conversations}


def test_chat_answers_parse_as_harmony_with_the_expected_structure(chat_answers, chat_workload):
    problems = [p for c in chat_workload.conversations for p in structure_problems(c, chat_answers[c.name])]
    assert not problems, "\n  ".join(["chat answers with harmony problems:"] + problems)


def test_chat_streams_and_fields_match_golden(chat_answers, goldens, tolerance):
    golden = goldens.settle("chat", goldens.load("chat", "level2", check_chat_golden), chat_golden_data(chat_answers))
    problems, notes = chat_problems(chat_answers, golden, tolerance)
    for n in notes:
        print("\n  ", n)
    assert not problems, "chat answers differ from the golden:\n  " + "\n  ".join(problems)


def test_task_accuracy_stays_above_its_recorded_floor(server, suite, chat_workload, goldens):
    if not suite.model.has_real_weights:
        pytest.skip(f"{suite.model.alias} has dummy weights: no task can be answered")
    result = run_tasks(server.client(), load_tasks(chat_workload.tasks_for(suite.model.alias)), chat_workload.task_max_tokens)
    print(f"\n  task accuracy {result.accuracy:.3f} ({result.correct}/{result.n}), harmony parse errors {result.parse_errors}"
          + "".join(f"\n    wrong: {w}" for w in result.wrong))
    task_file = chat_workload.tasks_for(suite.model.alias)
    digest = hashlib.sha256(task_file.read_bytes()).hexdigest()[:16]
    stored = goldens.settle("tasks", goldens.load("tasks", "level2", check_tasks_golden),
                            {**result.to_json(), "task_file": task_file.name, "task_sha256": digest})
    assert stored.get("task_sha256") == digest, (f"the stored accuracy is of another task set ({stored.get('task_file')}, "
                                                 f"sha {stored.get('task_sha256')}) than {task_file.name} ({digest}); "
                                                 "regenerate the tasks golden with --force-regen")
    floor = accuracy_floor(stored)
    assert result.accuracy >= floor, (f"task accuracy {result.accuracy:.3f} ({result.correct}/{result.n}) fell below "
                                      f"{floor:.3f} (recorded {stored['accuracy']:.3f} minus two binomial standard errors); "
                                      f"wrong: {result.wrong}")
