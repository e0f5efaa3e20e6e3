"""Tests of mxamp.launch: the local scheduler/server/worker launcher, with real processes.

Every test runs the launcher as a separate process (``python mxamp/launch.py``) with a unique
marker in its environment; afterwards no process carrying that marker may be left alive, which
proves that everything the launcher started was stopped.
"""
import io
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(ROOT, "mxamp", "launch.py")
sys.path.insert(0, ROOT)

from mxamp import launch  # noqa: E402  pylint: disable=wrong-import-position


_MARKERS = []


def _marker_env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    env["MXAMP_TEST_MARKER"] = uuid.uuid4().hex
    _MARKERS.append(env["MXAMP_TEST_MARKER"])
    return env


@pytest.fixture(autouse=True)
def _kill_leftovers():
    """Safety net: whatever a failing test left running is killed (the tests assert first)."""
    yield
    while _MARKERS:
        for pid in _processes_with(_MARKERS.pop()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _processes_with(marker):
    """PIDs of live processes whose environment holds ``MXAMP_TEST_MARKER=marker``."""
    needle = ("MXAMP_TEST_MARKER=" + marker).encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                if needle in f.read().split(b"\0"):
                    with open("/proc/%s/stat" % pid) as stat:
                        if stat.read().split(")")[-1].split()[0] != "Z":  # not a zombie
                            found.append(int(pid))
        except OSError:  # exited meanwhile, or not ours to read
            continue
    return found


def _script(tmp_path, body):
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def _run_launcher(args, env, timeout=90):
    started = time.monotonic()
    launcher = subprocess.Popen([sys.executable, LAUNCH] + args, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        output, _ = launcher.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        launcher.terminate()  # the launcher stops its children on SIGTERM
        output, _ = launcher.communicate(timeout=30)
        pytest.fail("the launcher overran %d s:\n%s" % (timeout, output.decode()[-3000:]))
    return launcher.returncode, output.decode(), time.monotonic() - started


def test_free_ports_are_distinct_and_increasing():
    ports = launch.free_ports(5)
    assert len(set(ports)) == 5 and ports == sorted(ports), (
        "free_ports must return distinct ports in increasing order (worker i gets rank i by "
        "port order), got %s" % ports)


def test_the_launcher_itself_never_imports_mxnet():
    """The launcher only starts processes; MXNet in its own process cost every launch 2 s
    (a one-worker job took 3.7 s against 1.2 s on the Zen 4). Python's import log says what
    it loaded, with the project on PYTHONPATH as the workers have it."""
    proc = subprocess.run([sys.executable, "-X", "importtime", LAUNCH, "--help"],
                          env=_marker_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
              if line.startswith("import time:")]
    assert "argparse" in loaded, "the import log is empty:\n" + proc.stderr[-2000:]
    assert not [m for m in loaded if m.split(".")[0] in ("mxnet", "mxamp")], (
        "the launcher imported %s" % [m for m in loaded if m.startswith(("mxnet", "mxamp"))])


def test_workers_get_kvstore_rank_equal_to_their_prefix_and_the_dmlc_environment(tmp_path):
    worker = _script(tmp_path, """
        import os, mxnet as mx
        kv = mx.kv.create('dist_sync')
        print('rank=%d workers=%d servers=%s uri=%s' % (kv.rank, kv.num_workers,
              os.environ['DMLC_NUM_SERVER'], os.environ['DMLC_PS_ROOT_URI']))
        kv.init(3, mx.nd.zeros((2,)))
        out = mx.nd.zeros((2,))
        kv.pushpull(3, mx.nd.ones((2,)) * (kv.rank + 1), out=out)
        print('sum=%g' % out[0].asscalar())
    """)
    env = _marker_env()
    code, output, _ = _run_launcher(["-n", "3", "-s", "2", "--timeout", "80", "--",
                                     sys.executable, worker], env)
    assert code == 0, "a 3-worker, 2-server dist_sync job must succeed:\n" + output
    for rank in range(3):
        assert ("[worker %d] rank=%d workers=3 servers=2 uri=127.0.0.1" % (rank, rank)
                in output), "worker %d's prefix must match its kvstore rank:\n%s" % (rank, output)
        assert "[worker %d] sum=6" % rank in output, (
            "the kvstore must sum 1+2+3 = 6 over the three workers:\n" + output)
    assert not _processes_with(env["MXAMP_TEST_MARKER"]), "processes left after a clean run"


def test_a_crashing_worker_stops_the_others_and_the_launcher_exits_non_zero(tmp_path):
    # Worker 0 blocks in a dist_sync pushpull that worker 1 never joins, and without the
    # launcher's exit hook worker 1 itself would hang in MXNet's kvstore shutdown.
    worker = _script(tmp_path, """
        import os, sys, mxnet as mx
        kv = mx.kv.create('dist_sync')
        kv.init(0, mx.nd.zeros((2,)))
        if kv.rank == 1:
            raise RuntimeError('worker 1 crashes')
        kv.pushpull(0, mx.nd.ones((2,)), out=mx.nd.zeros((2,)))
        mx.nd.waitall()
        print('unreachable')
    """)
    env = _marker_env()
    code, output, seconds = _run_launcher(["-n", "2", "-s", "1", "--grace-period", "2", "--",
                                           sys.executable, worker], env, timeout=60)
    assert code == 1, "the launcher must return the crashed worker's exit code 1, got %d:\n%s" % (
        code, output)
    assert "[worker 1] RuntimeError: worker 1 crashes" in output, "traceback must be shown"
    assert "[launch] worker 1 exited with code 1" in output, output
    assert "unreachable" not in output, "worker 0 cannot finish without worker 1:\n" + output
    # measured 6.6 s (Zen 4, 2 vCPUs at load average 4.7); the bound leaves slower CI room
    assert seconds < 45, "stopping after a crash took %.0f s (bound: 45 s)" % seconds
    assert not _processes_with(env["MXAMP_TEST_MARKER"]), (
        "the blocked worker, the server or the scheduler was left running")


def test_ctrl_c_stops_every_process_even_one_that_ignores_sigterm(tmp_path):
    worker = _script(tmp_path, """
        import signal, sys, time
        if sys.argv[1:] == ['stubborn']:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print('ready', flush=True)
        time.sleep(600)
    """)
    env = _marker_env()
    launcher = subprocess.Popen([sys.executable, LAUNCH, "-n", "2", "-s", "1",
                                 "--grace-period", "1", "--", sys.executable, worker,
                                 "stubborn"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
    try:
        lines = []
        while sum("ready" in line for line in lines) < 2:
            line = launcher.stdout.readline().decode()
            assert line, "launcher ended before both workers were ready:\n" + "".join(lines)
            lines.append(line)
        launcher.send_signal(signal.SIGINT)
        code = launcher.wait(timeout=30)
        rest = launcher.stdout.read().decode()
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert code == 130, "Ctrl-C must give exit code 130, got %d" % code
    assert "[launch] interrupted" in rest, rest
    assert not _processes_with(env["MXAMP_TEST_MARKER"]), (
        "a worker that ignores SIGTERM must still be killed (SIGKILL after the grace period)")


def test_timeout_stops_everything_with_code_124(tmp_path):
    worker = _script(tmp_path, "import time; time.sleep(600)\n")
    env = _marker_env()
    code, output, seconds = _run_launcher(["-n", "1", "-s", "1", "--timeout", "2",
                                           "--grace-period", "1", "--", sys.executable, worker],
                                          env, timeout=60)
    assert code == 124, "timeout must give 124, got %d:\n%s" % (code, output)
    # measured 2.2 s with --timeout 2 (Zen 4, load average 4.7); 20 s leaves slower CI room
    assert "timeout" in output and seconds < 20, "took %.1f s:\n%s" % (seconds, output)
    assert not _processes_with(env["MXAMP_TEST_MARKER"]), "processes left after the timeout"


def test_workers_that_finish_without_the_kvstore_end_the_job_with_code_0(tmp_path):
    # The servers then never hear from a worker; the launcher must not wait for them forever.
    worker = _script(tmp_path, "print('done')\n")
    env = _marker_env()
    code, output, seconds = _run_launcher(["-n", "2", "-s", "1", "--grace-period", "1", "--",
                                           sys.executable, worker], env, timeout=60)
    assert code == 0 and output.count("done") == 2, output
    # measured 1.3 s (Zen 4, load average 4.7); 20 s leaves slower CI room
    assert seconds < 20, "servers outliving their workers must be stopped, took %.1f s" % seconds
    assert not _processes_with(env["MXAMP_TEST_MARKER"]), "idle server or scheduler left running"


def test_signal_exit_is_reported_as_128_plus_signal(tmp_path):
    worker = _script(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)\n")
    code, output, _ = _run_launcher(["-n", "1", "--grace-period", "1", "--", sys.executable,
                                     worker], _marker_env(), timeout=60)
    assert code == 128 + signal.SIGKILL, "a SIGKILLed worker must give 137, got %d:\n%s" % (
        code, output)


def test_a_command_that_cannot_start_gives_127_and_leaves_nothing_running(tmp_path):
    env = _marker_env()
    missing = str(tmp_path / "no-such-program")
    code, output, _ = _run_launcher(["-n", "2", "--grace-period", "1", "--", missing], env,
                                    timeout=60)
    assert code == 127, "got %d:\n%s" % (code, output)
    assert "[launch] cannot start" in output and "no-such-program" in output, output
    assert not _processes_with(env["MXAMP_TEST_MARKER"]), (
        "the scheduler and server started before the failing worker must be stopped")


@pytest.mark.parametrize("argv, message", [
    (["-n", "2"], "no worker command"),
    (["-n", "2", "--"], "no worker command"),
    (["-n", "0", "--", "true"], "--num-workers must be at least 1"),
    (["-n", "1", "-s", "0", "--", "true"], "--num-servers must be at least 1"),
])
def test_bad_command_lines_are_rejected_with_a_message(argv, message, capsys):
    with pytest.raises(SystemExit) as raised:
        launch.main(argv)
    assert raised.value.code == 2, "argparse errors exit with 2"
    assert message in capsys.readouterr().err, "the error must say: " + message


@pytest.mark.parametrize("kwargs, message", [
    (dict(command=[], num_workers=1, num_servers=1), "no worker command"),
    (dict(command=["true"], num_workers=0, num_servers=1), "num_workers must be a positive"),
    (dict(command=["true"], num_workers=1, num_servers=1.5), "num_servers must be a positive"),
    (dict(command=["true"], num_workers=1, num_servers=1, grace_period=-1), "grace_period"),
])
def test_local_cluster_rejects_bad_arguments_before_starting_anything(kwargs, message):
    with pytest.raises(ValueError, match=message):
        launch.LocalCluster(output=io.BytesIO(), **kwargs)
