"""The drop-in API: names and parameters of mxnet.contrib.amp 1.9.1, dtype spellings, imports."""
import inspect
import os
import subprocess
import sys

import numpy as np
import pytest
from mxnet.contrib.amp import amp as reference

import mxamp
from mxamp import amp, dtypes

REFERENCE_FUNCTIONS = list(reference.__all__) + ["convert_bucketing_module"]

# Defaults that cannot make sense on a CPU-only machine: the reference uses ctx=gpu(0) and
# float16, which has no CPU kernels; mxamp's None means "the block's context / its best dtype".
# None where the reference's default cannot run here: a bare amp.init() means float16 with a GPU
# (the reference's default) and 'auto' without one (tests/test_standin.py checks both).
# cast_optional_params=None: a converted model stores the parameters it computes in low precision
# there (tests/test_convert.py counts their bytes); False is still the reference's behaviour.
CPU_SAFE_DEFAULTS = {("convert_hybrid_block", "ctx"), ("convert_hybrid_block", "target_dtype"),
                     ("convert_bucketing_module", "target_dtype"), ("init", "target_dtype"),
                     ("convert_symbol", "cast_optional_params"),
                     ("convert_model", "cast_optional_params"),
                     ("convert_hybrid_block", "cast_optional_params"),
                     ("convert_bucketing_module", "cast_optional_params")}


@pytest.mark.parametrize("name", REFERENCE_FUNCTIONS)
def test_every_reference_function_exists_with_its_parameters(name):
    assert hasattr(amp, name), "mxamp.amp lacks %s" % name
    ref = inspect.signature(getattr(reference, name)).parameters
    ours = inspect.signature(getattr(amp, name)).parameters
    ours_names = list(ours)
    for i, (pname, param) in enumerate(ref.items()):
        assert pname in ours, "%s lacks parameter %r" % (name, pname)
        if param.kind == param.POSITIONAL_OR_KEYWORD:
            assert ours_names.index(pname) == i, \
                "%s: parameter %r must stay at position %d for positional callers" % (name, pname, i)
        if param.default is not param.empty and (name, pname) not in CPU_SAFE_DEFAULTS:
            assert ours[pname].default == param.default, \
                "%s(%s=...) default differs: %r vs reference %r" % (
                    name, pname, ours[pname].default, param.default)


def test_cpu_safe_defaults_for_conversion():
    params = inspect.signature(amp.convert_hybrid_block).parameters
    assert params["ctx"].default is None, \
        "convert_hybrid_block must not default to gpu(0) on a CPU-only machine"
    assert params["target_dtype"].default is None, \
        "None picks bfloat16 on a CPU and float16 on a GPU"
    assert inspect.signature(amp.convert_bucketing_module).parameters["target_dtype"].default \
        is None


@pytest.mark.parametrize("name", REFERENCE_FUNCTIONS + ["list_fp16_ops", "list_fp16_fp32_ops",
                                                        "disabled", "reset", "patch_state"])
def test_top_level_reexports_and_docstrings(name):
    assert getattr(mxamp, name) is getattr(amp, name), "import mxamp must re-export %s" % name
    doc = getattr(amp, name).__doc__ or ""
    assert ">>>" in doc, "%s needs a docstring with an example" % name


@pytest.mark.parametrize("spelling, expected", [
    ("float16", "float16"), (np.float16, "float16"), (np.dtype("float16"), "float16"),
    ("bfloat16", "bfloat16"), (dtypes.BFLOAT16, "bfloat16")])
def test_every_dtype_spelling_is_accepted(spelling, expected):
    assert dtypes.normalize(spelling) == expected, spelling
    ours = amp.list_lp16_ops(spelling)
    assert "FullyConnected" in ours, "list_lp16_ops(%r) must list FullyConnected" % (spelling,)


@pytest.mark.parametrize("fn", ["list_lp16_ops", "list_fp32_ops", "list_lp16_fp32_ops",
                                "list_widest_type_cast", "list_loss_output_functions",
                                "list_conditional_fp32_ops", "list_lp16_use_fp32_params"])
def test_list_functions_reject_bad_dtypes(fn):
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        getattr(amp, fn)("int8")


def test_list_shapes_match_the_reference():
    for target, ref_target in (("float16", "float16"), ("bfloat16", reference.bfloat16)):
        ref_cond = reference.list_conditional_fp32_ops(ref_target)
        ours = amp.list_conditional_fp32_ops(target)
        assert all(isinstance(e, tuple) and len(e) == 3 and isinstance(e[2], list)
                   for e in ours + ref_cond), "conditional entries are (op, param, [values])"
        for fn in ("list_lp16_ops", "list_fp32_ops", "list_widest_type_cast"):
            assert isinstance(getattr(amp, fn)(target), list), "%s returns a list" % fn


def test_unimplemented_features_fail_loudly_not_silently():
    # Each public function either works or raises; none returns None silently for bad input.
    with pytest.raises((TypeError, RuntimeError, NotImplementedError)):
        amp.init_trainer({"not": "a trainer"})


def test_import_without_mxnet_names_the_extras():
    code = "import sys; sys.modules['mxnet'] = None; import mxamp"
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(mxamp.__file__)))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode != 0, "importing mxamp without MXNet must fail"
    assert "mxamp[cpu]" in proc.stderr and "mxamp[cu112]" in proc.stderr, \
        "the error must name the extras that install MXNet: %s" % proc.stderr[-500:]
