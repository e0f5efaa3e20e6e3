"""Generate docs/api.md from the docstrings of mxamp's public functions.

    python docs/gen_api.py            # rewrite docs/api.md
    python docs/gen_api.py --check    # exit 1 if docs/api.md is out of date (for CI)

Every name in ``mxamp.amp.__all__`` is documented (the ones not placed in a section below land
in "Other"), plus the extra public entry points listed in ``SECTIONS``. A listed name that does
not exist is skipped with a note on stderr, so the page follows the package as it changes.
"""
import argparse
import importlib
import inspect
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUTPUT = os.path.join(HERE, "api.md")

# (section title, one-line introduction, dotted names)
SECTIONS = [
    ("Operator patching (O1)", "Turn AMP on for every MXNet operator call.",
     ["mxamp.amp.init", "mxamp.amp.disabled", "mxamp.amp.is_initialized",
      "mxamp.amp.target_dtype", "mxamp.amp.patch_state", "mxamp.amp.op_lists",
      "mxamp.amp.reset"]),
    ("Loss scaling and the Trainer", "Hook a Gluon Trainer: scaling, skip-on-overflow, "
     "diagnostics.",
     ["mxamp.amp.init_trainer", "mxamp.amp.scale_loss", "mxamp.amp.unscale",
      "mxamp.amp.loss_scaler", "mxamp.training.trainer.loss_scaler",
      "mxamp.amp.global_norm_and_overflow", "mxamp.training.trainer.global_norm_and_overflow",
      "mxamp.training.trainer_scaler.TrainerScaler", "mxamp.training.trainer.TrainerConfig",
      "mxamp.training.scaler.LossScaler", "mxamp.training.scaler.ScalerConfig"]),
    ("Whole-model low precision (O2)", "Cast a model's parameters; train with fp32 master "
     "weights.",
     ["mxamp.amp.cast_model", "mxamp.conversion.o2.cast_model"]),
    ("Inference conversion", "Rewrite a graph for low-precision inference.",
     ["mxamp.amp.convert_hybrid_block", "mxamp.amp.convert_model", "mxamp.amp.convert_symbol",
      "mxamp.amp.convert_bucketing_module", "mxamp.amp.accuracy_report",
      "mxamp.compare.accuracy_report"]),
    ("Operator lists", "Which operator runs in which precision, per target dtype.",
     ["mxamp.amp.list_lp16_ops", "mxamp.amp.list_fp32_ops", "mxamp.amp.list_lp16_fp32_ops",
      "mxamp.amp.list_conditional_fp32_ops", "mxamp.amp.list_widest_type_cast",
      "mxamp.amp.list_loss_output_functions", "mxamp.amp.list_lp16_use_fp32_params",
      "mxamp.amp.list_fp16_ops", "mxamp.amp.list_fp16_fp32_ops", "mxamp.precision.resolve.lists_for",
      "mxamp.backend.registry.check_op_names", "mxamp.lists.reference_view.apply_edits"]),
    ("Errors", "The one exception type of a bad argument.",
     ["mxamp.errors.AmpArgumentError"]),
    ("CPUs, devices and precision plans", "The bfloat16 class of this CPU, what each request "
     "computes where, AMX enablement; `python -m mxamp.doctor` prints it all. One plan "
     "(`mxamp.precision.plan`) decides precision for every entry point; `amp.tune` chooses a policy per "
     "model by timing it.",
     ["mxamp.amp.cpu_features", "mxamp.backend.cpu.cpu_features", "mxamp.backend.cpu.classify_bf16",
      "mxamp.amp.precision_plan", "mxamp.amp.precision_of", "mxamp.precision.plan.make", "mxamp.precision.plan.Plan",
      "mxamp.precision.plan.decide", "mxamp.precision.device_plan.DevicePlan", "mxamp.precision.device_plan.device_plan",
      "mxamp.amp.tune", "mxamp.precision.policy.Policy", "mxamp.doctor.main"]),
]


def resolve(dotted):
    """The object named ``package.module.attr``, or None when it does not exist."""
    module_name, _, attr = dotted.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    return getattr(module, attr, None)


def signature_of(obj, name):
    try:
        return f"{name}{inspect.signature(obj)}"
    except (TypeError, ValueError):
        return name


_HEADING = re.compile(r"^(\S[^\n]*)\n[-=~]{3,}$", re.M)
_PARAM_LINE = re.compile(r"^([A-Za-z_*][\w, *]*) : (\S.*)$")


def docstring_to_markdown(doc):
    """numpydoc/RST docstring -> Markdown: fenced examples, bold section names, plain code."""
    doc = _HEADING.sub(lambda m: f"**{m.group(1).strip()}**\n", doc)
    doc = re.sub(r":(?:func|class|mod|meth|attr|data):`~?([^`]+)`", r"`\1`", doc)
    doc = re.sub(r"``([^`]+)``", r"`\1`", doc)
    out, lines, i = [], doc.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith(">>>"):
            block = []
            while i < len(lines) and lines[i].strip():
                block.append(lines[i])
                i += 1
            out += ["```python", *block, "```"]
            continue
        if line.rstrip().endswith("::") and i + 1 < len(lines):
            out.append(line.rstrip()[:-1])  # "Example::" -> "Example:"
            i += 1
            while i < len(lines) and not lines[i].strip():
                i += 1
            block = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith((" ", "\t"))):
                block.append(lines[i])
                i += 1
            while block and not block[-1].strip():
                block.pop()
            indent = min(len(b) - len(b.lstrip()) for b in block if b.strip()) if block else 0
            out += ["", "```", *[b[indent:] for b in block], "```", ""]
            continue
        param = _PARAM_LINE.match(line)
        if param:  # numpydoc "name : type" plus its indented description -> one bullet
            name, kind = param.groups()
            i += 1
            text = []
            while i < len(lines) and lines[i].startswith((" ", "\t")) and lines[i].strip():
                text.append(lines[i].strip())
                i += 1
            out.append(f"- `{name.strip()}` ({kind.strip()})" + (": " + " ".join(text)
                                                                   if text else ""))
            continue
        out.append(line)
        i += 1
    return "\n".join(out).strip()


def document(dotted, obj):
    public = dotted.replace("mxamp.amp.", "amp.")
    kind = "class" if inspect.isclass(obj) else "function"
    source = getattr(obj, "__module__", "")
    lines = [f"### `{public}`", "", "```python", signature_of(obj, public), "```", ""]
    if source and not dotted.startswith(source + "."):
        lines += [f"*{kind}, defined in `{source}`*", ""]
    lines += [docstring_to_markdown(inspect.getdoc(obj) or "(no docstring)"), ""]
    if inspect.isclass(obj):
        for attr, member in sorted(vars(obj).items()):
            if attr.startswith("_") or not (inspect.isfunction(member)
                                            or isinstance(member, property)):
                continue
            doc = inspect.getdoc(member) or ""
            first = doc.splitlines()[0] if doc else ""
            lines.append(f"- `{attr}`: {docstring_to_markdown(first)}")
        lines.append("")
    return lines


def generate():
    sys.path.insert(0, ROOT)
    amp = importlib.import_module("mxamp.amp")
    version = importlib.import_module("mxamp").__version__
    seen_objects, body, toc = set(), [], []
    placed = {d.split(".")[-1] for _, _, names in SECTIONS for d in names
              if d.startswith("mxamp.amp.")}
    others = [f"mxamp.amp.{n}" for n in amp.__all__ if n not in placed]
    for title, intro, names in SECTIONS + [("Other", "Further public names of `mxamp.amp`.",
                                            others)]:
        entries = []
        for dotted in names:
            obj = resolve(dotted)
            if obj is None:
                print(f"gen_api: {dotted} does not exist, skipped", file=sys.stderr)
                continue
            if id(obj) in seen_objects:  # the same function re-exported under two names
                continue
            seen_objects.add(id(obj))
            entries.append((dotted, obj))
        if not entries:
            continue
        anchor = re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")
        toc.append(f"- [{title}](#{anchor}): "
                   + ", ".join(f"`{d.split('.')[-1]}`" for d, _ in entries))
        body += [f"## {title}", "", intro, ""]
        for dotted, obj in entries:
            body += document(dotted, obj)
    header = [
        "# mxamp API reference",
        "",
        f"Generated from the docstrings of mxamp {version} by `python docs/gen_api.py`; "
        "do not edit by hand.",
        "",
        "`from mxamp import amp` gives the same names as `from mxnet.contrib import amp`, plus "
        "mxamp's additions. Every function is also importable from `mxamp` directly.",
        "",
    ]
    return "\n".join(header + toc + [""] + body).rstrip() + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 if docs/api.md differs from the docstrings")
    args = parser.parse_args(argv)
    text = generate()
    if args.check:
        current = open(OUTPUT).read() if os.path.exists(OUTPUT) else ""
        if current != text:
            print("docs/api.md is out of date: run python docs/gen_api.py", file=sys.stderr)
            return 1
        return 0
    with open(OUTPUT, "w") as f:
        f.write(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
