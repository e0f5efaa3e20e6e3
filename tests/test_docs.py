"""Docs that cannot drift: the API page is generated from the code, the architecture page
lists every module, and what the README says about CI is what ``.ci/run`` does."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_api_page_is_generated_from_the_current_docstrings():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "docs", "gen_api.py"), "--check"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, ("docs/api.md is stale: run `python docs/gen_api.py`\n%s%s"
                                  % (proc.stdout[-1500:], proc.stderr[-1500:]))


def test_architecture_page_is_one_table_of_the_tree():
    """docs/architecture.md's table names every module of the package, and only those."""
    text = open(os.path.join(ROOT, "docs", "architecture.md")).read()
    rows = re.findall(r"^\| [a-z ]+ \| \d \| `([^`]+\.py)` \|", text, re.M)
    assert len(rows) == len(set(rows)), "a module is in the table twice: %s" % sorted(
        r for r in rows if rows.count(r) > 1)
    on_disk = set()
    for folder, _, files in os.walk(os.path.join(ROOT, "mxamp")):
        on_disk |= {os.path.relpath(os.path.join(folder, n), os.path.join(ROOT, "mxamp"))
                    .replace(os.sep, "/") for n in files if n.endswith(".py")}
    assert not on_disk - set(rows), "docs/architecture.md's table lacks: %s" % sorted(
        on_disk - set(rows))
    assert not set(rows) - on_disk, "docs/architecture.md names modules that do not exist: %s" \
        % sorted(set(rows) - on_disk)


def test_the_table_ranks_agree_with_the_rank_test():
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import test_layers
    text = open(os.path.join(ROOT, "docs", "architecture.md")).read()
    for rank, path in re.findall(r"^\| [a-z ]+ \| (\d) \| `([^`]+\.py)` \|", text, re.M):
        module = "mxamp." + path[:-3].replace("/", ".")
        module = module[:-len(".__init__")] if module.endswith(".__init__") else module
        assert test_layers.RANKS[test_layers.unit_of(module)] == int(rank), \
            "%s has rank %s in docs/architecture.md, %d in tests/test_layers.py" % (
                path, rank, test_layers.RANKS[test_layers.unit_of(module)])


def test_readme_has_one_table_of_the_environment_variables_mxamp_reads():
    from mxamp.backend import env
    readme = open(os.path.join(ROOT, "README.md")).read()
    section = readme.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    table = re.findall(r"^\| `([A-Z_]+)` \|", section, re.M)
    assert sorted(table) == sorted(env.VARIABLES), (
        "README's table %s != mxamp.backend.env.VARIABLES %s" % (sorted(table),
                                                                   sorted(env.VARIABLES)))
    assert readme.count("## Environment variables") == 1, "one table of them"


def test_the_package_reads_the_environment_only_through_its_reader():
    """Reads only: setting a variable for oneDNN or a child process is not reading one
    (``os.environ[X] = ...``); a comparison (``os.environ[X] == ...``) is a read."""
    offenders = []
    for folder, _, files in os.walk(os.path.join(ROOT, "mxamp")):
        for name in files:
            path = os.path.join(folder, name)
            if not name.endswith(".py") or path.endswith(os.path.join("backend", "env.py")):
                continue
            for number, line in enumerate(open(path), 1):
                if re.search(r"os\.environ(\.get|\[[^]]+\](?!\s*=(?!=)))|os\.getenv", line) \
                        and ">>>" not in line and not line.strip().startswith("del "):
                    offenders.append("%s:%d: %s" % (os.path.relpath(path, ROOT), number,
                                                    line.strip()))
    assert not offenders, "read environment variables with mxamp.backend.env:\n" + \
        "\n".join(offenders)


def test_readme_says_what_ci_runs():
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    readme = open(os.path.join(ROOT, "README.md")).read()
    steps = ["bash ci/test.sh", "bash ci/test.sh -m cpu_class", "ci/probe_amx.py",
             "bash ci/horovod.sh -k horovod"]
    for step in steps:
        assert step in ci, ".ci/run no longer runs %r" % step
        assert step in readme, "README does not mention what CI runs: %s" % step
    for setting in ("MXAMP_AMX=0", "DNNL_MAX_CPU_ISA=AVX512_CORE", "DNNL_MAX_CPU_ISA=AVX2"):
        assert setting in ci and setting in readme, (
            "the class matrix setting %s must be in .ci/run and the README" % setting)
    test_sh = open(os.path.join(ROOT, "ci", "test.sh")).read()
    assert "--doctest-modules tests mxamp" in test_sh, "ci/test.sh runs tests and doctests"
    assert re.search(r"^bash ci/test\.sh", readme, re.M), "the README opens with the test command"
