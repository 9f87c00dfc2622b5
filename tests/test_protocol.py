"""The parent <-> worker protocol (core/protocol.py): the request's JSON both ways, the worker reading it, and the
one classifier of outcomes, with the words each caller gives a timeout and a worker that died. No GPU: the
outcomes are made here, as run_worker would hand them back."""

import json
import sys

import pytest

from flashcore_cli.core.protocol import LAST_WORDS, WorkerOutcome, WorkRequest, Wording, classify
from flashcore_cli.registry.shapes import Case, Shape

CASES = [Case(Shape(1, 2, s, 64), False, 7 + i) for i, s in enumerate((64, 97, 128))]
BUILT = {"event": "built", "key": "K", "cached": False}
CRASH = {"event": "crash", "where": "w", "error": "RuntimeError: CUDA error: an illegal memory access"}


def case_events(case: Case, status: str = "OK") -> list[dict]:
    return [{"event": "case-start", "case": case.as_dict()},
            {"event": "case", "case": case.as_dict(), "status": status, "max_error": 0.5, "tolerance": 0.1, "detail": "d"}]  # fmt: skip


# ---------------------------------------------------------------- the request
def test_a_request_round_trips_through_its_json():
    request = WorkRequest("bench", "variants.yaml", "v11", "sm_90", defines={"BLOCK_M": "64"}, case=CASES[0].as_dict(), reps=100,
                          warmup=10, modes=["cold", "host"], passes="fwd+bwd")  # fmt: skip
    data = json.loads(json.dumps(request.to_json()))
    assert data["pass"] == "fwd+bwd" and "passes" not in data and data["task"] == "bench"
    assert WorkRequest.from_json({**data, "events": "/tmp/events.jsonl"}) == request  # the events path is not the request's


def test_the_worker_reads_the_request_and_reports_a_task_it_does_not_know(tmp_path, monkeypatch):
    from flashcore_cli import worker

    events = tmp_path / "events.jsonl"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**WorkRequest("nonesuch").to_json(), "events": str(events)}))
    assert worker.main([sys.executable, str(spec)]) == 3
    (crash,) = [json.loads(line) for line in events.read_text().splitlines()]
    assert crash == {"event": "crash", "where": "nonesuch", "error": "KeyError: 'nonesuch'"}


# ---------------------------------------------------------------- the classifier
@pytest.mark.parametrize(
    "outcome, verdict",
    [
        (WorkerOutcome("done", [BUILT, {"event": "done"}]), ("OK", "")),
        (WorkerOutcome("done", [{"event": "build-failed", "errors": "k.cu(3): error", "log": ""}, {"event": "done"}]),
         ("BUILD-FAIL", "k.cu(3): error")),
        (WorkerOutcome("timeout", [BUILT], phase="run"), ("TIMEOUT", "killed after 30 s (run)")),
        (WorkerOutcome("done", [BUILT, CRASH, {"event": "done"}]), ("CRASH", CRASH["error"])),
        (WorkerOutcome("crash", [BUILT], returncode=-11, log_tail="Segmentation fault"), ("CRASH", "Segmentation fault")),
    ],
)  # fmt: skip
def test_classify_the_first_that_holds(outcome, verdict):
    got = classify(outcome, timeout=30.0)
    assert (got.status, got.detail) == verdict


def test_a_worker_that_said_done_without_the_answer_crashed():
    outcome = WorkerOutcome("done", [BUILT, {"event": "done"}], returncode=0, log_tail="tail")
    assert classify(outcome, answered=False).status == "CRASH"
    assert classify(outcome, answered=False, wording=Wording(died="worker {status}, exit {returncode}\n{log_tail}")).detail == (
        "worker done, exit 0\ntail"
    )


def test_last_words_are_the_crash_s_error_else_the_log():
    assert classify(WorkerOutcome("timeout", [CRASH], log_tail="tail"), wording=LAST_WORDS).detail == CRASH["error"]
    assert classify(WorkerOutcome("timeout", [], log_tail="tail"), wording=LAST_WORDS).detail == "tail"


# ---------------------------------------------------------------- each caller's words, unchanged
def fake_worker(monkeypatch, module, outcome: WorkerOutcome) -> list[WorkRequest]:
    asked = []
    monkeypatch.setattr(module, "run_worker", lambda request, **kw: asked.append(request) or outcome)
    return asked


def test_test_classifies_each_case(monkeypatch):
    from flashcore_cli.check import correctness
    from flashcore_cli.registry.variants import load_registry

    reg = load_registry(None)
    died = WorkerOutcome("crash", [BUILT, *case_events(CASES[0]), case_events(CASES[1])[0]], returncode=-11, log_tail="tail")
    asked = fake_worker(monkeypatch, correctness, died)
    result = correctness.run_variant(reg, reg.get("baseline"), CASES, arch="sm_90", timeout=30.0)
    assert asked[0].task == "test" and asked[0].cases == [c.as_dict() for c in CASES]
    assert [(c.status, c.detail) for c in result.cases] == [
        ("OK", "d"), ("CRASH", "worker died (exit -11)\ntail"), ("NOT-RUN", "an earlier case of this variant timed out or crashed")]  # fmt: skip
    assert result.build == BUILT and result.detail == ""
    fake_worker(monkeypatch, correctness, WorkerOutcome("timeout", [BUILT, case_events(CASES[0])[0]], phase="run"))
    result = correctness.run_variant(reg, reg.get("baseline"), CASES, arch="sm_90", timeout=30.0)
    assert result.cases[0].detail == "no result after 30 s; process group killed" and result.status == "TIMEOUT"
    fake_worker(monkeypatch, correctness, WorkerOutcome("timeout", []))
    result = correctness.run_variant(reg, reg.get("baseline"), CASES, arch="sm_90", timeout=30.0)
    assert {(c.status, c.detail) for c in result.cases} == {("TIMEOUT", "the build did not finish in time")}
    assert result.detail == "the build did not finish in time"
    fake_worker(monkeypatch, correctness, WorkerOutcome("crash", [CRASH], returncode=3))
    result = correctness.run_variant(reg, reg.get("baseline"), CASES, arch="sm_90", timeout=30.0)
    assert {(c.status, c.detail) for c in result.cases} == {("CRASH", CRASH["error"])} and result.detail == CRASH["error"]


def test_bench_and_tune_word_their_failures_as_before(monkeypatch):
    from flashcore_cli.core import isolate
    from flashcore_cli.measure import bench, tune
    from flashcore_cli.registry.variants import load_registry

    reg = load_registry(None)
    fake_worker(monkeypatch, bench, WorkerOutcome("timeout", [BUILT], phase="run"))
    (row,) = bench.bench_variant(reg, reg.get("baseline"), CASES[0], arch="sm_90", reps=100, warmup=1, timeout=30.0).values()
    assert (row.status, row.detail, row.key) == ("TIMEOUT", "killed after 30 s (run)", "K")
    fake_worker(monkeypatch, bench, WorkerOutcome("done", [BUILT, *case_events(CASES[0], "MISMATCH"), {"event": "done"}]))
    (row,) = bench.bench_variant(reg, reg.get("baseline"), CASES[0], arch="sm_90", reps=100, warmup=1, timeout=30.0).values()
    assert (row.status, row.detail) == ("MISMATCH", "not timed: d (max error 0.5 > tolerance 0.1)")
    fake_worker(monkeypatch, bench, WorkerOutcome("crash", [{"event": "built", "note": "n"}], log_tail="tail"))
    rows, _ = bench.bench_references(CASES[0], reps=100, warmup=1, timeout=30.0)
    assert [(r.name, r.status, r.detail) for r in rows["cold"]] == [("references", "CRASH", "tail")]
    job = tune.TrialJob("r", "baseline", "sm_90", (("X", "1"),), (CASES[0].as_dict(),), CASES[0].as_dict(), 100, 1, 30.0, "host")
    fake_worker(monkeypatch, isolate, WorkerOutcome("crash", [BUILT, *case_events(CASES[0])], returncode=-9, log_tail="tail"))
    assert tune.run_trial(job)["detail"] == "worker crash, exit -9\ntail"
    fake_worker(monkeypatch, isolate, WorkerOutcome("done", [BUILT, *case_events(CASES[0], "MISMATCH"), {"event": "done"}]))
    assert (tune.run_trial(job)["status"], tune.run_trial(job)["detail"]) == ("MISMATCH", "1,2,64,64: d")


# ---------------------------------------------------------------- the event kinds
def test_every_event_kind_is_declared_once_documented_and_used_by_name():
    """core/events.py declares the kinds (Event) and what each carries (FIELDS); protocol's documentation lists
    every kind (made from FIELDS); no module spells a kind as a string where it sends or looks for one, and every
    declared kind is used somewhere by its name."""
    import ast

    from conftest import REPO
    from flashcore_cli.core import protocol
    from flashcore_cli.core.events import FIELDS, Event

    kinds = {name: value for name, value in vars(Event).items() if name.isupper()}
    assert set(FIELDS) == set(kinds.values())
    documented = {line.split()[0] for line in protocol.__doc__.splitlines() if line.startswith("    ") and line.strip()}
    assert set(kinds.values()) <= documented
    spelled, used = [], set()
    for path in sorted((REPO / "flashcore_cli").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Event":
                used.add(node.attr)
            literal = None
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in ("emit", "find", "_first"):
                literal = node.args[0] if node.args else None
            elif isinstance(node, ast.Dict):
                literal = next((v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant) and k.value == "event"), None)
            if isinstance(literal, ast.Constant) and literal.value in kinds.values():
                spelled.append(f"{path.relative_to(REPO)}:{node.lineno} {literal.value!r}")
    assert not spelled, "event kinds spelled as strings: " + "; ".join(spelled)
    assert used >= set(kinds), f"declared, never used: {sorted(set(kinds) - used)}"
