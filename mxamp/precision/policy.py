"""A tuned policy: what runs in which precision for one model, as data.

:func:`mxamp.tuning.tune` measures a model under a few candidate policies and returns the
fastest as a :class:`Policy`: a target dtype and edits to its op lists (ops added to the float32
list, conditional float32 rules), with the table that chose it. A policy is saved beside the
model (:meth:`Policy.save`, :meth:`Policy.load`), explained (:meth:`Policy.explain`), and put in
force by ``amp.init(policy=...)`` / ``amp.convert_hybrid_block(net, policy=...)`` (both read it
through :mod:`mxamp.precision.plan`), or as the reference's op-list arguments (:meth:`Policy.init_kwargs`).

>>> p = Policy('bfloat16, BatchNorm in float32', 'bfloat16', extra_fp32_ops=['BatchNorm'])
>>> for line in p.explain().splitlines()[:2]:
...     print(line)
policy 'bfloat16, BatchNorm in float32': bfloat16, per mxamp's op lists
  BatchNorm in float32
"""
import json
from dataclasses import asdict, dataclass, field

from mxamp.errors import AmpArgumentError
from mxamp.precision.resolve import lists_for

#: The target of a policy that keeps float32 compute everywhere.
FLOAT32 = "float32"


@dataclass
class Policy:
    """What runs in which precision for one model: a target and op-list edits, with the table
    that chose it.

    >>> p = Policy('bf16, stem in float32', 'bfloat16',
    ...            conditional_fp32_ops=[['Convolution', 'in_channels', ['<=4']]])
    >>> ('Convolution', 'in_channels', ['<=4']) in p.init_kwargs()['conditional_fp32_ops']
    True
    """

    name: str
    #: 'bfloat16'/'float16', or 'float32': float32 compute (tune leaves AMP off;
    #: ``amp.init(policy=...)`` turns AMP on, computing in float32)
    target: str
    extra_fp32_ops: list = field(default_factory=list)       #: added to the target's fp32 list
    conditional_fp32_ops: list = field(default_factory=list)  #: (op, condition, values)
    table: list = field(default_factory=list)  #: rows: name, ms, ratio to float32, top ops
    device: str = ""                     #: the CPU class or 'gpu' it was tuned on
    why: str = ""                        #: why tune chose it, in a few words

    def init_kwargs(self):
        """Keyword arguments for ``amp.init`` (``{}`` for float32: do not call init).

        ``fp32_ops`` and ``conditional_fp32_ops`` replace the target's defaults (as in the
        reference), so each is the default list plus this policy's additions.
        """
        if self.target == FLOAT32:
            return {}
        out = {"target_dtype": self.target}
        fp32_ops, conditional_fp32_ops = self.overrides()
        if self.extra_fp32_ops:
            out["fp32_ops"] = fp32_ops
        if self.conditional_fp32_ops:
            out["conditional_fp32_ops"] = conditional_fp32_ops
        return out

    def overrides(self, fp32_ops=None, conditional_fp32_ops=None):
        """``(fp32_ops, conditional_fp32_ops)`` that put this policy in force on top of a
        caller's lists (None: the target's defaults): the float32 list gains the policy's ops,
        and each of its conditional rules replaces the rules of that op. A float32 policy, or a
        list the policy does not touch, is returned as given.

        >>> Policy('bf16', 'bfloat16', ['BatchNorm']).overrides(fp32_ops=['softmax'])
        (['BatchNorm', 'softmax'], None)
        """
        if self.target == FLOAT32:
            return fp32_ops, conditional_fp32_ops
        if self.extra_fp32_ops:
            base = lists_for(self.target).fp32 if fp32_ops is None else fp32_ops
            fp32_ops = sorted(set(base) | set(self.extra_fp32_ops))
        if self.conditional_fp32_ops:
            if conditional_fp32_ops is None:
                conditional_fp32_ops = [
                    (op, param, list(values))
                    for op, (param, values) in lists_for(self.target).conditional_fp32.items()]
            tuned = {entry[0] for entry in self.conditional_fp32_ops}
            kept = [tuple(e) for e in conditional_fp32_ops if e[0] not in tuned]
            conditional_fp32_ops = sorted(
                kept + [(op, param, list(values))
                        for op, param, values in self.conditional_fp32_ops],
                key=lambda entry: entry[0])
        return fp32_ops, conditional_fp32_ops

    def convert_kwargs(self):
        """Keyword arguments for ``amp.convert_*`` (``{}`` for float32: do not convert).

        >>> Policy('bf16', 'bfloat16', ['BatchNorm']).convert_kwargs()['target_dtype']
        'bfloat16'
        """
        return self.init_kwargs()

    def explain(self):
        """The policy in words, and the table that chose it.

        >>> print(Policy('float32', 'float32').explain())
        policy 'float32': float32 compute
          (no measurements)
        """
        lines = ["policy %r: %s" % (self.name, "float32 compute" if self.target == FLOAT32
                                    else "%s, per mxamp's op lists" % self.target)]
        if self.why:
            lines.append("  chosen: %s" % self.why)
        for op in self.extra_fp32_ops:
            lines.append("  %s in float32" % op)
        for op, param, values in self.conditional_fp32_ops:
            lines.append("  %s in float32 where %s is %s" % (op, param, " or ".join(values)))
        lines.append(format_table(self.table))
        return "\n".join(lines)

    def save(self, path):
        """Write the policy as JSON (beside the model's parameters, say).

        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), 'policy.json')
        >>> Policy('bfloat16', 'bfloat16').save(path); Policy.load(path).name
        'bfloat16'
        """
        with open(path, "w") as f:
            json.dump(asdict(self), f, indent=1)

    @classmethod
    def load(cls, path):
        """Read a policy :meth:`save` wrote (:class:`~mxamp.errors.AmpArgumentError` for a
        JSON file that is not one)."""
        with open(path) as f:
            data = json.load(f)
        try:
            return cls(**data)
        except TypeError as err:
            raise AmpArgumentError("%s is not a policy mxamp.tuning saved: %s" % (path, err)) \
                from None


def format_table(rows):
    """The tuning table as text: policy, step time, ratio to float32, costliest ops.

    >>> print(format_table([{'name': 'float32', 'ms': 10.0, 'ratio': 1.0, 'chosen': True}]))
    ... # doctest: +NORMALIZE_WHITESPACE
      policy        ms/step  vs fp32  costliest ops (ms)
      float32          10.0    1.00x    <= chosen
    """
    if not rows:
        return "  (no measurements)"
    lines = ["  %-34s %10s %8s  %s" % ("policy", "ms/step", "vs fp32", "costliest ops (ms)")]
    for row in rows:
        ops = ", ".join("%s %.1f" % (op_label(name), ms) for name, ms in row.get("top_ops", []))
        if row.get("error"):
            ops = "failed: %s" % row["error"]
        lines.append("  %-34s %10.1f %7.2fx  %s%s" % (row["name"], row["ms"], row["ratio"], ops,
                                                      "  <= chosen" if row.get("chosen") else ""))
    return "\n".join(lines)


def op_label(name):
    """A profiler entry's name for the table: MXNet's bulk execution (static_alloc graphs)
    times a segment of ops as one, named by all of them; keep the first and the count.

    >>> op_label('_backward_Convolution,_backward_Activation,add_n')
    '_backward_Convolution +2 (one bulk segment)'
    """
    ops = name.split(",")
    return name if len(ops) == 1 else "%s +%d (one bulk segment)" % (ops[0], len(ops) - 1)
