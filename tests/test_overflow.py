"""One-pass finite checks and norms over gradient lists, on real MXNet arrays."""
import math

import mxnet as mx
import numpy as np
import pytest

from mxamp import dtypes
from mxamp.training import overflow

INF, NAN = float("inf"), float("nan")


def bf16(values):
    return mx.nd.amp_cast(mx.nd.array(values), dtype=dtypes.BFLOAT16)


def random_arrays(n, dtype="float32", ctx=mx.cpu(0)):
    rng = np.random.RandomState(0)
    return [mx.nd.array(rng.randn(int(rng.randint(1, 50))), dtype=dtype, ctx=ctx)
            for _ in range(n)]


def test_clean_list_has_no_overflow():
    report = overflow.check_finite(random_arrays(10))
    assert not report.has_nonfinite and report.bad_indices == [], "finite data flagged"


@pytest.mark.parametrize("bad_value", [INF, -INF, NAN])
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "bfloat16"])
def test_each_non_finite_value_is_found_in_each_dtype(bad_value, dtype):
    values = [[1.0, 2.0], [3.0, bad_value, 4.0], [5.0]]
    arrays = [bf16(v) if dtype == "bfloat16" else mx.nd.array(v, dtype=dtype) for v in values]
    report = overflow.check_finite(arrays)
    assert report.has_nonfinite and report.bad_indices == [1], \
        "%s %r in array 1 must be reported, got %s" % (dtype, bad_value, report.bad_indices)


def test_large_finite_float16_values_are_not_overflows():
    # A sum of squares in float16 would overflow above 256; the check must not use one.
    arrays = [mx.nd.array([300.0] * 64 + [65504.0], dtype="float16")]
    assert not overflow.check_finite(arrays).has_nonfinite, "finite fp16 values flagged"


def test_square_overflow_of_finite_float32_is_not_an_overflow():
    # 3e19 squared is inf in float32: the exact re-check must clear it.
    report = overflow.check_finite([mx.nd.array([3e19, 1.0]), mx.nd.array([3e19, INF])])
    assert report.bad_indices == [1], "only the array that really holds inf is non-finite"


def test_large_finite_bfloat16_values_are_not_overflows():
    assert not overflow.check_finite([bf16([1e30, -2e30])]).has_nonfinite


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_large_arrays_take_the_per_array_path_and_are_exact(dtype):
    size = overflow.LARGE_ARRAY + 3
    values = np.full((3, size), 300.0, dtype=np.float32)   # 300**2 * size overflows fp16
    values[1, -1], values[2, 5] = INF, NAN
    arrays = [mx.nd.amp_cast(mx.nd.array(v), dtype=dtypes.BFLOAT16) if dtype == "bfloat16"
              else mx.nd.array(v, dtype=dtype) for v in values]
    report = overflow.check_finite(arrays)
    assert report.bad_indices == [1, 2], "large %s arrays: got %s" % (dtype, report.bad_indices)
    norm, bad = overflow.global_norm(arrays[:1])
    # multi_sum_sq accumulates in float32: measured 3.7e-4 relative error on these 65k equal
    # squares (Zen 4, the same for all three dtypes and every class): 2.7x margin
    assert not bad and norm == pytest.approx(300.0 * np.sqrt(size), rel=1e-3), norm


def test_mixed_dtypes_and_contexts_keep_input_positions():
    arrays = [mx.nd.ones((3,), ctx=mx.cpu(1)), mx.nd.ones((2,), dtype="float16"),
              bf16([1.0, NAN]), mx.nd.array([INF], ctx=mx.cpu(1)), mx.nd.ones((4,))]
    report = overflow.check_finite(arrays)
    assert report.bad_indices == [2, 3], "positions must survive grouping by dtype/context"


def test_many_arrays_span_several_multi_sum_sq_calls():
    arrays = random_arrays(overflow._MAX_ARRAYS_PER_CALL + 90)
    arrays[overflow._MAX_ARRAYS_PER_CALL + 7][0] = NAN
    arrays[3][0] = INF
    report = overflow.check_finite(arrays)
    assert report.bad_indices == [3, overflow._MAX_ARRAYS_PER_CALL + 7]


def test_numpy_interface_and_row_sparse_arrays_are_checked():
    dense = mx.nd.array([[1.0, 2.0], [INF, 0.0]])
    sparse = dense.tostype("row_sparse")
    report = overflow.check_finite([mx.nd.ones((2,)).as_np_ndarray(), sparse,
                                    mx.nd.array([NAN]).as_np_ndarray()])
    assert report.bad_indices == [1, 2], "np ndarrays and row_sparse values must be checked"


def test_empty_list():
    assert overflow.check_finite([]) == overflow.FiniteReport(False, [], [])
    assert overflow.global_norm([]) == (0.0, False)


def test_check_uses_one_host_synchronisation(monkeypatch):
    calls = []
    real = mx.nd.NDArray.asnumpy

    def counting_asnumpy(self):
        calls.append(self.shape)
        return real(self)

    monkeypatch.setattr(mx.nd.NDArray, "asnumpy", counting_asnumpy)
    arrays = random_arrays(40) + random_arrays(5, "float16") + [bf16([1.0, 2.0])]
    mx.nd.waitall()
    overflow.check_finite(arrays)
    assert calls == [(46,)], "expected one copy of a 46-value vector, got %s" % calls


def test_global_norm_matches_numpy_across_dtypes():
    arrays = random_arrays(20) + random_arrays(4, "float16") + [bf16([0.5, -1.5, 3.0])]
    expected = math.sqrt(sum(float(np.sum(np.square(
        mx.nd.amp_cast(a, dtype="float32").asnumpy().astype(np.float64)))) for a in arrays))
    norm, bad = overflow.global_norm(arrays)
    # float32 accumulation against float64: measured 2.3e-8 relative (Zen 4, every class); the
    # bound, 1e-6 (8 float32 ulps), leaves room for another summation order (thread count)
    assert not bad and norm == pytest.approx(expected, rel=1e-6), (norm, expected)


def test_global_norm_of_non_finite_gradients_is_flagged():
    norm, bad = overflow.global_norm([mx.nd.ones((2,)), mx.nd.array([INF], dtype="float16")])
    assert bad and math.isnan(norm), "a non-finite gradient must give (nan, True)"


def test_finite_checker_reuses_its_plan_only_for_the_same_arrays():
    checker = overflow.FiniteChecker()
    grads = [mx.nd.ones((3,)), mx.nd.ones((2,), dtype="float16")]
    assert not checker.check(grads).has_nonfinite
    grads[1][0] = INF                       # same objects, new data: the plan still applies
    assert checker.check(grads).bad_indices == [1], "new data in the same arrays"
    others = [mx.nd.array([NAN, 1.0, 2.0], dtype="float16"), mx.nd.ones((2,))]
    assert checker.check(others).bad_indices == [0], "another list must get its own plan"
    norm, _ = overflow.global_norm([mx.nd.array([3.0]), mx.nd.array([4.0])])
    report = checker.check([mx.nd.array([3.0]), mx.nd.array([4.0])], squares_for_all=True)
    assert report.sum_squares == [9.0, 16.0] and norm == 5.0


# ----- large float32 CPU arrays: the zero-vector probe -----
PROBE_SHAPES = [(512, 256), (64, 32, 48), (300, 1024)]   # >= LARGE_ARRAY values each


@pytest.mark.parametrize("where", ["first", "last", "middle"])
@pytest.mark.parametrize("bad", [INF, -INF, NAN])
def test_large_arrays_are_probed_and_every_position_is_caught(where, bad):
    arrays = [mx.nd.random.uniform(-1, 1, shape=s) for s in PROBE_SHAPES]
    checker = overflow.FiniteChecker()
    plan_report = checker.check(arrays)
    assert not plan_report.has_nonfinite, "random finite arrays flagged"
    assert set(checker._plans[False].probed) == {0, 1, 2}, "large CPU fp32 arrays are probed"
    target = arrays[1]
    flat_index = {"first": 0, "last": target.size - 1, "middle": target.size // 2 + 7}[where]
    values = target.asnumpy()
    values.flat[flat_index] = bad
    target[:] = mx.nd.array(values)
    report = checker.check(arrays)
    assert report.has_nonfinite and report.bad_indices == [1], (
        "%s at the %s value of a probed array: %s" % (bad, where, report))
    assert report.sum_squares == [None, None, None], "a probe reports no sum of squares"


def test_probe_ignores_huge_finite_values_and_takes_float16():
    huge = mx.nd.ones((512, 256)) * 3e38                    # finite; its square overflows
    half = mx.nd.array(np.full((512, 256), 60000.0), dtype="float16")
    assert not overflow.check_finite([huge, half]).has_nonfinite, "finite values flagged"
    half[3, 4] = float("inf")
    assert overflow.check_finite([huge, half]).bad_indices == [1]


def test_probe_without_onednn_propagates_nan_too():
    """MXNET_MKLDNN_ENABLED=0: FullyConnected runs on MXNet's own BLAS path."""
    import subprocess
    import sys
    code = ("import mxnet as mx; from mxamp.training import overflow\n"
            "a = mx.nd.ones((512, 256)); b = a.copy(); b[7, 9] = float('nan')\n"
            "c = a.copy(); c[511, 255] = float('-inf')\n"
            "print(overflow.check_finite([a, b, c]).bad_indices)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=dict(__import__("os").environ,
                                                MXNET_MKLDNN_ENABLED="0"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[1, 2]", proc.stdout


# ----- low-precision arrays larger than one workspace slice -----
#: What the module documents: low-precision arrays are cast into a float32 workspace of at
#: most 4 MB, a slice at a time. (2100, 1000) is 2.1 M values: three slices of whole rows.
SLICED_SHAPES = [(2100, 1000), (2_100_000,)]      # a probe (rows), a flag (1-D)


@pytest.mark.parametrize("shape", SLICED_SHAPES)
@pytest.mark.parametrize("flat_index", [0, 1_048_575, 1_048_576, 2_099_999])
def test_a_bfloat16_array_larger_than_a_slice_is_caught_in_every_slice(shape, flat_index):
    """A value just before and just after the first slice boundary, and in the first and the
    last value, each found; the workspace stays at one slice (4 MB)."""
    from mxamp.runtime.casting import WORKSPACE
    WORKSPACE.clear()
    values = np.random.RandomState(0).uniform(-1, 1, size=shape).astype(np.float32)
    clean = mx.nd.amp_cast(mx.nd.array(values), dtype=dtypes.BFLOAT16)
    assert not overflow.check_finite([clean]).has_nonfinite, "finite values flagged"
    values.flat[flat_index] = INF
    dirty = mx.nd.amp_cast(mx.nd.array(values), dtype=dtypes.BFLOAT16)
    assert overflow.check_finite([clean, dirty]).bad_indices == [1], (
        "Inf at value %d of a bfloat16 array of shape %s" % (flat_index, shape))
    held = sum(b.size * 4 for b in WORKSPACE._buffers().values())
    assert held <= 4 * 2 ** 20, "the check's float32 workspace holds %d B" % held


def test_global_norm_of_a_large_bfloat16_array_sums_its_slices():
    """float32 sums per slice, added on the device, against the float64 norm of the same
    bfloat16 values. MXNet's multi_sum_sq accumulates in float32: measured here, one call
    over the whole 2.5 M values is 6.3e-4 off (relative, on the norm) and the sum of three
    slices 9.5e-5; the bound, 3e-4, holds the sliced sum and not the whole one."""
    values = np.random.RandomState(1).uniform(-2, 2, size=(2_500_000,)).astype(np.float32)
    grad = mx.nd.amp_cast(mx.nd.array(values), dtype=dtypes.BFLOAT16)
    exact = np.sqrt(np.sum(np.square(
        mx.nd.amp_cast(grad, dtype="float32").asnumpy().astype(np.float64))))
    norm, bad = overflow.global_norm([mx.nd.ones((3,)), grad])
    assert not bad and norm == pytest.approx(math.sqrt(exact ** 2 + 3), rel=3e-4)
    grad[2_400_000] = NAN
    assert overflow.global_norm([mx.nd.ones((3,)), grad])[1], "a NaN in the last slice"
