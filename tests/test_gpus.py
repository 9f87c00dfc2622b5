"""Several GPUs (gpus.py): sweep and tune spread their points over one lane process per visible GPU.

No GPU here, so two GPUs are faked: the lanes are the real spawned processes pinned through
CUDA_VISIBLE_DEVICES, and only the measurement they run is fake. Every fake measurement appends a line to a log
file ($FC_TEST_LANE_LOG), so a test counts how often each point was measured and in which lane. A lane is
killed for real (SIGKILL on its pid) by a thread of the test while the run goes on.
"""

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flashcore_cli.measure.bench import BenchRow
from flashcore_cli.cli import app
from flashcore_cli.measure.gpus import LaneLost, map_on_gpus
from flashcore_cli.registry.shapes import Case, parse_shape
from flashcore_cli.measure.sweep import PointJob
from flashcore_cli.measure.tune import Candidate, TrialJob, best_per_gpu, ranked

runner = CliRunner()
LOG = "FC_TEST_LANE_LOG"  # the file every fake measurement appends "<point> <lane's GPU> <pid>" to
HANG = "FC_TEST_HANG_PID"  # when set: the lane of GPU 1 writes its pid there and hangs on its first job
FAKE_TIMINGS = {32: 30.0, 64: 20.0, 128: 25.0}  # tune: BLOCK_M -> median us; BLOCK_M=64 wins


# ---------------------------------------------------------------- fakes, run inside the lanes
def measured(point) -> str:
    gpu = os.environ["CUDA_VISIBLE_DEVICES"]
    if os.environ.get(HANG) and gpu == "1":
        Path(os.environ[HANG]).write_text(str(os.getpid()))
        time.sleep(120)  # until the test kills this lane
    with open(os.environ[LOG], "a") as log:
        log.write(f"{point} {gpu} {os.getpid()}\n")
    time.sleep(0.1)  # long enough that both lanes get work
    return gpu


def fake_square(x: int) -> int:
    measured(x)
    return x * x


def fake_point(job: PointJob) -> dict:
    s = Case.from_dict(job.case).shape.seq_len
    gpu = measured(f"{s}:{job.variant or 'references'}")
    timing = {"median_us": s / 10, "p10_us": s / 11, "p90_us": s / 9, "samples_us": [s / 10] * job.reps}
    name = f"FAKE GPU {gpu}"
    if job.variant is None:
        return {"rows": [BenchRow("sdpa", "reference", "OK", timing)], "environment": {"gpu": name}, "gpu_name": name}
    return {"rows": [BenchRow(job.variant, "variant", "OK", timing)], "environment": {}, "gpu_name": name}


def fake_trial(job: TrialJob) -> dict:
    defines = dict(job.defines)
    measured(" ".join(f"{k}={v}" for k, v in job.defines))
    median = FAKE_TIMINGS[int(defines["BLOCK_M"])] + 0.5 * int(defines["STAGES"])
    timing = {"median_us": median, "p10_us": median - 0.1, "p90_us": median + 0.1}
    return {"status": "OK", "timing": timing, "gpu": "FAKE H200", "key": "k", "detail": "", "environment": {"gpu": "FAKE H200"}}


# ---------------------------------------------------------------- helpers
def log_lines(path: Path) -> list[tuple[str, str, str]]:
    return [tuple(line.rsplit(" ", 2)) for line in path.read_text().splitlines()]


def kill_the_hanging_lane(pid_file: Path) -> threading.Thread:
    """A thread that waits for the lane of GPU 1 to hang, then kills that lane's process for real."""

    def kill():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if pid_file.exists() and pid_file.read_text():
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def lane_log(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "lanes.log"
    path.touch()
    monkeypatch.setenv(LOG, str(path))  # the lanes are spawned after this, so they inherit it
    return path


def fake_sweep(monkeypatch, tmp_path) -> dict:
    """`flashcore sweep baseline --seq 512,1024,2048` on two faked GPUs; returns its record."""

    from flashcore_cli.measure import gpus
    from flashcore_cli.measure import sweep
    monkeypatch.setattr(sweep, "run_point", fake_point)  # handed to the lanes by reference: they import this module
    monkeypatch.setattr(gpus, "visible_gpus", lambda: ["0", "1"])
    monkeypatch.setattr("flashcore_cli.core.gpu.require_gpu", lambda command: None)
    monkeypatch.setenv("FLASHCORE_RESULTS", str(tmp_path))
    result = runner.invoke(app, ["sweep", "baseline", "--seq", "2048,512,1024"])
    assert result.exit_code == 0, result.output
    (saved,) = tmp_path.glob("sweep-*.json")
    return json.loads(saved.read_text())


# ---------------------------------------------------------------- the lanes
def test_two_lanes_split_the_jobs_and_run_each_exactly_once(lane_log):
    ran_in = {}
    results = map_on_gpus(fake_square, list(range(8)), ["0", "1"], on_done=lambda i, r, gpu: ran_in.setdefault(i, gpu))
    assert results == [x * x for x in range(8)]  # in job order, whichever lane finished first
    log = log_lines(lane_log)
    assert sorted(int(job) for job, _, _ in log) == list(range(8))  # each job measured once
    assert {int(job): gpu for job, gpu, _ in log} == ran_in  # on_done names the lane that ran it
    assert {gpu for _, gpu, _ in log} == {"0", "1"} and len({pid for _, _, pid in log}) == 2  # two lane processes


def test_a_killed_lane_costs_only_the_job_it_was_running(lane_log, tmp_path, monkeypatch):
    pid_file = tmp_path / "lane1.pid"
    monkeypatch.setenv(HANG, str(pid_file))
    killer = kill_the_hanging_lane(pid_file)
    results = map_on_gpus(fake_square, list(range(6)), ["0", "1"])
    killer.join()
    lost = [i for i, r in enumerate(results) if isinstance(r, LaneLost)]
    assert len(lost) == 1 and results[lost[0]].gpu == "1" and "died" in results[lost[0]].reason
    assert all(results[i] == i * i for i in range(6) if i not in lost)  # the other lane took the rest of the queue
    log = log_lines(lane_log)
    assert sorted(int(job) for job, _, _ in log) == [i for i in range(6) if i not in lost]  # each exactly once
    assert {gpu for _, gpu, _ in log} == {"0"}


def test_jobs_left_when_every_lane_died_are_reported_not_dropped(lane_log, tmp_path, monkeypatch):
    pid_file = tmp_path / "lane1.pid"
    monkeypatch.setenv(HANG, str(pid_file))
    killer = kill_the_hanging_lane(pid_file)
    results = map_on_gpus(fake_square, [1, 2, 3], ["1"])
    killer.join()
    assert all(isinstance(r, LaneLost) for r in results)
    assert "died while running it" in results[0].reason and all("every GPU's lane" in r.reason for r in results[1:])
    assert lane_log.read_text() == ""


# ---------------------------------------------------------------- sweep and tune on two faked GPUs
def test_sweep_on_two_lanes_merges_every_point_once_into_one_record(lane_log, tmp_path, monkeypatch):
    record = fake_sweep(monkeypatch, tmp_path)
    rows = record["rows"]
    # one record, in job order (S ascending; references before the variant), every point once
    assert [(r["seq_len"], r["name"]) for r in rows] == [(s, n) for s in (512, 1024, 2048) for n in ("sdpa", "baseline")]
    log = log_lines(lane_log)
    points = sorted(point for point, _, _ in log)
    assert points == sorted(f"{s}:{n}" for s in (512, 1024, 2048) for n in ("references", "baseline"))
    # the record says which GPU measured which point: the lane that logged it, and its model
    lane_of = {point: gpu for point, gpu, _ in log}
    for r in rows:
        point = f"{r['seq_len']}:{'references' if r['kind'] == 'reference' else r['name']}"
        assert r["gpu"] == lane_of[point] and r["gpu_name"] == f"FAKE GPU {r['gpu']}" and r["status"] == "OK"
    assert {r["gpu"] for r in rows} == {"0", "1"}  # both GPUs were busy
    assert record["gpus"] == ["0", "1"] and record["lanes"] == 2 and record["wall_s"] > 0


def test_sweep_with_a_killed_lane_keeps_the_rest_of_the_record(lane_log, tmp_path, monkeypatch):
    pid_file = tmp_path / "lane1.pid"
    monkeypatch.setenv(HANG, str(pid_file))
    killer = kill_the_hanging_lane(pid_file)
    record = fake_sweep(monkeypatch, tmp_path)
    killer.join()
    rows = record["rows"]
    crashed = [r for r in rows if r["status"] != "OK"]
    assert len(crashed) == 1  # the point lane 1 was measuring when it died, and no other
    (dead,) = crashed
    assert dead["status"] == "CRASH" and dead["gpu"] == "1" and "lane process of GPU 1 died" in dead["detail"]
    points = {(r["seq_len"], r["kind"]) for r in rows}
    assert len(points) == 6 and len(rows) == 6  # every point is in the record, the lost one included
    measured_points = [point for point, _, _ in log_lines(lane_log)]
    assert len(measured_points) == 5 == len(set(measured_points))  # the other five, each once, on GPU 0
    assert all(r["gpu"] == "0" for r in rows if r is not dead)


def test_tune_on_two_lanes_picks_the_same_winner_as_on_one(lane_log, monkeypatch):
    from flashcore_cli.measure import gpus
    from flashcore_cli.measure import tune
    monkeypatch.setattr(tune, "run_trial", fake_trial)
    template = TrialJob("r.yaml", "v", "sm_90", (), (), Case(parse_shape("1,8,512,64"), False, 1).as_dict(), 100, 10, 60.0)
    outcomes = {}
    for lanes in (["0"], ["0", "1"]):
        monkeypatch.setattr(gpus, "visible_gpus", lambda lanes=lanes: lanes)
        candidates = [Candidate({"BLOCK_M": m, "STAGES": s}) for m in FAKE_TIMINGS for s in (2, 3)]
        _, summary = tune.run_trials(template, candidates)
        assert summary["lanes"] == len(lanes) and summary["gpus"] == lanes and summary["wall_s"] > 0
        assert {c.lane for c in candidates} == set(lanes)
        outcomes[len(lanes)] = ({gpu: c.defines for gpu, c in best_per_gpu(candidates).items()}, [c.label for c in ranked(candidates)])
    assert outcomes[1] == outcomes[2] == ({"FAKE H200": {"BLOCK_M": 64, "STAGES": 2}}, outcomes[1][1])
    assert len(log_lines(lane_log)) == 2 * 6  # each trial once per run


# ---------------------------------------------------------------- on a host with two GPUs
@pytest.mark.gpu
def test_sweep_on_two_real_gpus(tmp_path, monkeypatch):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    monkeypatch.setenv("FLASHCORE_RESULTS", str(tmp_path))
    result = runner.invoke(app, ["sweep", "baseline", "v8", "--seq", "256,512", "--heads", "4"])
    assert result.exit_code == 0, result.output
    (saved,) = tmp_path.glob("sweep-*.json")
    record = json.loads(saved.read_text())
    assert record["lanes"] >= 2 and len({r["gpu"] for r in record["rows"]}) >= 2
    assert all(r["status"] == "OK" and r["gpu_name"] for r in record["rows"])


def test_ctrl_c_stops_every_lane_at_once_and_quietly(tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) during a map on two lanes: the caller gets
    KeyboardInterrupt at once and exits 130, with no traceback, no pool thread of map_on_gpus still running when it
    does, and no lane left running. (multiprocessing's resource tracker may still print a "leaked semaphore" warning
    at exit, intermittently: not asserted here.)"""
    import subprocess
    import sys

    (tmp_path / "slow_job.py").write_text(  # each job says it started (a file named by its lane's pid), then sleeps
        "import os, pathlib, time\n\n"
        "def slow(x):\n"
        "    (pathlib.Path(os.environ['FC_TEST_STARTED']) / str(os.getpid())).touch()\n"
        "    time.sleep(60)\n"
        "    return x\n"
    )
    started = tmp_path / "started"
    started.mkdir()
    (tmp_path / "run_map.py").write_text(
        "import sys, threading\n"
        "from flashcore_cli.measure.gpus import map_on_gpus\n"
        "import slow_job\n"
        "if __name__ == '__main__':\n"
        "    print('started', flush=True)\n"
        "    try:\n"
        "        map_on_gpus(slow_job.slow, list(range(6)), ['0', '1'])\n"
        "    except KeyboardInterrupt:\n"
        "        print('threads', *[t.name for t in threading.enumerate()], flush=True)\n"
        "        sys.exit(130)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).resolve().parents[1])]),
           "FC_TEST_STARTED": str(started)}
    proc = subprocess.Popen([sys.executable, "run_map.py"], cwd=tmp_path, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 120  # both lanes spawned, imported and inside a job (a slow machine: CI)
        while len(list(started.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(list(started.iterdir())) == 2
        os.killpg(proc.pid, signal.SIGINT)
        start = time.monotonic()
        out, err = proc.communicate(timeout=30)
        waited = time.monotonic() - start
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert waited < 10, waited
    # every pool's manager and queue threads are gone before the caller sees the KeyboardInterrupt: none is left
    # closing a pipe that the interpreter's exit hook then writes to ('OSError: Bad file descriptor'); a lane thread
    # may still be alive for the few instructions after it said it is done
    words = out.split()
    assert words[0] == "threads" and "MainThread" in words, out
    assert all(w == "MainThread" or w.endswith("(lane)") for w in words[1:]), out  # finished lanes may linger
    assert "Traceback" not in err, err
    deadline = time.monotonic() + 5  # anything left of the group (a lane, the resource tracker) winds down
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("a process of the interrupted map was still running 5 s after it exited")
