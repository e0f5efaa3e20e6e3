"""Run MXNet's parameter-server kvstore on one machine: scheduler, servers and workers on 127.0.0.1.

``python -m mxamp.launch -n 2 -s 1 -- python train.py --epochs 1`` starts one scheduler, one
server and two copies of ``python train.py --epochs 1`` with the ``DMLC_*`` variables that
``mx.kv.create('dist_sync')`` reads, prints every line a process writes with a prefix naming it
(``[worker 1] ...``), and stops every process it started as soon as one of them fails, on Ctrl-C or
when ``--timeout`` expires. Its exit code is the first non-zero exit code among the processes
(128 + N for a process killed by signal N, 124 on timeout, 127 when the command cannot be
started, 130 on Ctrl-C), or 0.

A Python worker that raises an uncaught exception prints its traceback and exits with code 1
at once (the launcher puts a small ``sitecustomize`` on the workers' ``PYTHONPATH``): left alone,
it would hang at exit in MXNet's kvstore shutdown, waiting for workers that wait for it.

Worker ``i`` of the launch gets kvstore rank ``i``: ps-lite's scheduler numbers the workers by their
port, and the launcher hands out ports in increasing order.

Servers and the scheduler are plain ``python -c "import mxnet"`` processes: importing MXNet with
``DMLC_ROLE=server`` (or ``scheduler``) runs the server loop of ``mxnet.kvstore.kvstore_server``
and exits when the workers finish. For several machines use MXNet's own ``tools/launch.py``.
"""
import argparse
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

if __package__:
    from mxamp.errors import AmpArgumentError
else:  # run as a file (python mxamp/launch.py): its sibling module, found on sys.path[0],
    # without the package, whose __init__ imports MXNet (2 s that a launcher never needs)
    from errors import AmpArgumentError  # pylint: disable=import-error

__all__ = ["LocalCluster", "free_ports", "main"]

LOG = logging.getLogger(__name__)

EXIT_TIMEOUT = 124
EXIT_NOT_STARTED = 127
EXIT_INTERRUPTED = 130
_SERVER_COMMAND = [sys.executable, "-c", "import mxnet"]

# Put first on each worker's PYTHONPATH. A Python worker that dies of an uncaught exception
# would otherwise hang at exit: MXNet's kvstore shutdown waits in a barrier for the other
# workers, which wait for its gradients. Printing the traceback and leaving with os._exit(1)
# lets the launcher see the failure and stop the rest. A sitecustomize found further down the
# path still runs.
_WORKER_SITECUSTOMIZE = textwrap.dedent('''\
    import importlib.machinery, importlib.util, os, sys

    def _mxamp_exit_on_uncaught(kind, value, traceback, _previous=sys.excepthook):
        _previous(kind, value, traceback)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(1)

    sys.excepthook = _mxamp_exit_on_uncaught
    _here = os.path.dirname(os.path.abspath(__file__))
    _spec = importlib.machinery.PathFinder.find_spec(
        "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here])
    if _spec is not None:
        _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
''')


def free_ports(count, host="127.0.0.1"):
    """Return ``count`` distinct TCP ports that were free on ``host``, in increasing order.

    The sockets are held open together so that no port is returned twice, then closed.

    >>> ports = free_ports(3)
    >>> len(set(ports)) == 3 and ports == sorted(ports)
    True
    """
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return sorted(sock.getsockname()[1] for sock in sockets)
    finally:
        for sock in sockets:
            sock.close()


def _exit_code(returncode):
    """Map Popen's negative 'killed by signal N' to the shell's 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class _Process:
    """One started process: its name, its Popen and the thread copying its output."""

    def __init__(self, name, command, env, output, output_lock):
        self.name = name
        self.is_worker = name.startswith("worker")
        # A new session makes the child the leader of its own process group: stopping the group
        # also stops whatever the command started (a shell's children, data loaders).
        self.popen = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        self._copier = threading.Thread(target=self._copy_output, args=(output, output_lock),
                                        daemon=True, name="output of " + name)
        self._copier.start()

    def _copy_output(self, output, output_lock):
        prefix = ("[%s] " % self.name).encode()
        for line in iter(self.popen.stdout.readline, b""):
            with output_lock:
                output.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
                output.flush()
        self.popen.stdout.close()

    def signal_group(self, signum):
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signum)
            except ProcessLookupError:  # exited between poll() and killpg()
                pass

    def finish_output(self, timeout):
        self._copier.join(timeout)


class LocalCluster:
    """A scheduler, ``num_servers`` servers and ``num_workers`` copies of ``command`` on loopback.

    Use :meth:`run` to start everything and wait; it always stops what it started.

    >>> import io
    >>> cluster = LocalCluster([sys.executable, '-c', 'print(1)'], num_workers=1, num_servers=1,
    ...                        output=io.BytesIO())
    >>> cluster.run(timeout=60)                  # doctest: +SKIP
    0
    """

    def __init__(self, command, num_workers, num_servers, grace_period=5.0, output=None,
                 env=None):
        if not command:
            raise AmpArgumentError("no worker command given: put it after '--', e.g. "
                                   "python -m mxamp.launch -n 2 -s 1 -- python train.py")
        for label, count in (("num_workers", num_workers), ("num_servers", num_servers)):
            if not isinstance(count, int) or count < 1:
                raise AmpArgumentError("%s must be a positive integer, got %r" % (label, count))
        if grace_period < 0:
            raise AmpArgumentError("grace_period must be >= 0 seconds, got %r" % (grace_period,))
        self.command = list(command)
        self.num_workers = num_workers
        self.num_servers = num_servers
        self.grace_period = grace_period
        self._output = output if output is not None else sys.stdout.buffer
        self._output_lock = threading.Lock()
        self._base_env = dict(os.environ if env is None else env)
        self._processes = []
        self._site_dir = None
        self._interrupted = None     # set by the SIGINT/SIGTERM handler of run()

    def _env(self, role, port=None):
        env = dict(self._base_env)
        env.update(DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(self._root_port),
                   DMLC_NUM_SERVER=str(self.num_servers), DMLC_NUM_WORKER=str(self.num_workers),
                   DMLC_ROLE=role, DMLC_NODE_HOST="127.0.0.1", PYTHONUNBUFFERED="1")
        if port is not None:
            env["PORT"] = str(port)  # ps-lite binds here; its scheduler ranks workers by port
        if role == "worker":
            env["PYTHONPATH"] = os.pathsep.join(
                [self._site_dir] + [p for p in [env.get("PYTHONPATH")] if p])
        return env

    def _start(self, name, command, env):
        self._processes.append(_Process(name, command, env, self._output, self._output_lock))

    def start(self):
        """Start the scheduler, the servers and the workers (in that order)."""
        ports = free_ports(1 + self.num_workers)
        self._site_dir = tempfile.mkdtemp(prefix="mxamp-launch-")
        with open(os.path.join(self._site_dir, "sitecustomize.py"), "w") as f:
            f.write(_WORKER_SITECUSTOMIZE)
        self._root_port, worker_ports = ports[0], ports[1:]
        self._start("scheduler", _SERVER_COMMAND, self._env("scheduler"))
        for index in range(self.num_servers):
            self._start("server %d" % index, _SERVER_COMMAND, self._env("server"))
        for index, port in enumerate(worker_ports):
            self._start("worker %d" % index, self.command, self._env("worker", port))
        LOG.info("started %d workers and %d servers, scheduler on 127.0.0.1:%d",
                 self.num_workers, self.num_servers, self._root_port)

    def wait(self, timeout=None, poll_interval=0.05):
        """Wait until the workers finish or a process fails; return the first non-zero exit code.

        Once every worker has exited with 0, the servers and the scheduler get the grace
        period to exit on their own. Returns ``EXIT_TIMEOUT`` (124) if ``timeout`` seconds pass
        first. Stops nothing itself (see :meth:`stop`).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        running = list(self._processes)
        workers_done_at = None
        while running:
            if self._interrupted:
                raise KeyboardInterrupt(self._interrupted)
            for process in list(running):
                code = process.popen.poll()
                if code is None:
                    continue
                running.remove(process)
                if code != 0:
                    self._note("%s exited with code %d" % (process.name, _exit_code(code)))
                    return _exit_code(code)
            if workers_done_at is None and not any(p.is_worker for p in running):
                workers_done_at = time.monotonic()
            if workers_done_at is not None and (
                    time.monotonic() - workers_done_at > self.grace_period):
                break  # servers that outlive their workers are stopped by stop()
            if deadline is not None and time.monotonic() > deadline:
                self._note("timeout: %s still running after %g s"
                           % (", ".join(p.name for p in running), timeout))
                return EXIT_TIMEOUT
            time.sleep(poll_interval)
        return 0

    def stop(self):
        """Stop every process group still running: SIGTERM, then SIGKILL after the grace period."""
        for process in self._processes:
            process.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_period
        for process in self._processes:
            try:
                process.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.signal_group(signal.SIGKILL)
                process.popen.wait()
        for process in self._processes:
            process.finish_output(timeout=1.0)
        if self._site_dir is not None:
            shutil.rmtree(self._site_dir, ignore_errors=True)

    def run(self, timeout=None):
        """Start everything, wait (at most ``timeout`` seconds), stop everything; return the code.

        Ctrl-C (and SIGTERM sent to this process) stops the children too and returns 130.
        """
        # Ctrl-C and SIGTERM only set a flag that the wait loop checks: an exception raised
        # asynchronously inside Popen.poll() can leave Popen's internal wait lock held, and the
        # final wait() in stop() would then block forever.
        on_main_thread = threading.current_thread() is threading.main_thread()
        previous = {}
        if on_main_thread:
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous[signum] = signal.signal(signum, self._on_signal)
        try:
            try:
                self.start()
            except OSError as err:  # e.g. a misspelt worker command
                self._note("cannot start %r: %s" % (" ".join(self.command), err))
                return EXIT_NOT_STARTED
            return self.wait(timeout)
        except KeyboardInterrupt:
            self._note("interrupted: stopping all processes")
            return EXIT_INTERRUPTED
        finally:
            self.stop()
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _on_signal(self, signum, frame):  # pylint: disable=unused-argument
        self._interrupted = "signal %d" % signum

    def _note(self, message):
        with self._output_lock:
            self._output.write(("[launch] %s\n" % message).encode())
            self._output.flush()


def _parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m mxamp.launch",
        description="Run a distributed MXNet (ps-lite kvstore) job on this machine.",
        epilog="example: python -m mxamp.launch -n 2 -s 1 -- python train.py --kvstore dist_sync")
    parser.add_argument("-n", "--num-workers", type=int, required=True, help="worker processes")
    parser.add_argument("-s", "--num-servers", type=int, default=1,
                        help="server processes (default 1)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="stop everything after this many seconds and exit with 124")
    parser.add_argument("--grace-period", type=float, default=5.0,
                        help="seconds between SIGTERM and SIGKILL when stopping (default 5)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the worker command, after '--'")
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        parser.error("no worker command: put it after '--'")
    for name in ("num_workers", "num_servers"):
        if getattr(args, name) < 1:
            parser.error("--%s must be at least 1" % name.replace("_", "-"))
    return args


def main(argv=None):
    """Command-line entry point (``mxamp-launch`` / ``python -m mxamp.launch``); returns the code.

    >>> main(['-n', '2', '-s', '1', '--', 'python', 'train.py'])   # doctest: +SKIP
    0
    """
    args = _parse_args(argv)
    cluster = LocalCluster(args.command, args.num_workers, args.num_servers,
                           grace_period=args.grace_period)
    return cluster.run(timeout=args.timeout)


if __name__ == "__main__":
    sys.exit(main())
