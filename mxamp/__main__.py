"""``python -m mxamp run [--target auto|bfloat16|float16] SCRIPT [ARGS...]`` (and ``mxamp-run``).

Runs a script that uses ``mxnet.contrib.amp`` with mxamp standing in for it, without editing
the script or the libraries it imports: :func:`mxamp.install` first, then the script as
``__main__`` (as ``python SCRIPT ARGS`` would: ``sys.argv`` is ``[SCRIPT, ARGS...]`` and its
folder leads ``sys.path``). ``-m MODULE`` runs a module instead of a file. The script's exit
code is the command's. It composes with launchers: ``horovodrun -np 2 python -m mxamp run
train.py``, ``python -m mxamp.launch -n 2 python -m mxamp run train.py``.
"""
import argparse
import os
import runpy
import sys

USAGE = "python -m mxamp run [--target auto|bfloat16|float16] (SCRIPT | -m MODULE) [ARGS...]"


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m mxamp", usage=USAGE,
        description="Run a script that uses mxnet.contrib.amp with mxamp in its place.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="run")
    run = commands.add_parser("run", usage=USAGE, help="run SCRIPT with mxamp installed")
    run.add_argument("--target", default=None,
                     help="what a bare amp.init() in the script means: auto (bfloat16 where "
                          "this CPU computes it faster, float32 elsewhere; float16 on a GPU), "
                          "bfloat16 or float16 (default: mxamp's, float16 with a GPU, auto "
                          "without)")
    run.add_argument("-m", dest="module", default=None, help="run a module, as python -m")
    run.add_argument("script", nargs="?", help="the script to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return parser


def run(argv=None):
    """Run ``python -m mxamp run ...`` with ``argv`` (default ``sys.argv[1:]``); returns the
    script's exit code."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.module is None and not args.script:
        _parser().error("run needs a SCRIPT or -m MODULE")
    from mxamp.standin import check_target, install
    install(None if args.target is None else check_target(args.target))
    rest = ([args.script] if args.module is not None and args.script else []) + args.args
    try:
        if args.module is not None:
            sys.argv = [args.module] + rest
            runpy.run_module(args.module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [args.script] + rest
            sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
            runpy.run_path(args.script, run_name="__main__")
    except SystemExit as done:
        return _exit_code(done.code)
    return 0


def _exit_code(code):
    """The exit status Python gives ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def main():
    """The ``mxamp-run`` console script: ``mxamp-run [--target T] SCRIPT [ARGS...]``."""
    sys.exit(run(["run"] + sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(run())
