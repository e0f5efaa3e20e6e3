"""The pure loss-scale state machine: growth, backoff, bounds, hysteresis, static, state."""
import pytest

from mxamp.training.scaler import HISTORY_LENGTH, LossScaler


def feed(scaler, verdicts):
    """Feed a string of verdicts ('o' overflow, '.' clean); return the scale after each."""
    return [scaler.update(v == "o").new_scale for v in verdicts]


def test_defaults_match_the_documented_float16_values():
    s = LossScaler()
    assert (s.scale, s.growth_factor, s.backoff_factor, s.growth_interval) == \
        (2.0 ** 16, 2.0, 0.5, 2000), "documented defaults changed"
    assert (s.min_scale, s.max_scale, s.hysteresis, s.dynamic) == (1.0, 2.0 ** 24, 1, True)


def test_overflow_backs_off_for_the_very_next_step():
    s = LossScaler(init_scale=1024.0)
    outcome = s.update(found_overflow=True)
    assert outcome.skipped and outcome.old_scale == 1024.0
    assert s.scale == 512.0, "the new scale must be in force right after the overflowed step"


def test_growth_after_interval_clean_steps_and_counter_reset_by_overflow():
    s = LossScaler(init_scale=4.0, growth_interval=3)
    assert feed(s, "..") == [4.0, 4.0], "no growth before 3 clean steps"
    assert feed(s, "o") == [2.0], "overflow backs off"
    assert s.clean_steps == 0, "an overflow restarts the clean-step count"
    assert feed(s, "...") == [2.0, 2.0, 4.0], "grows on the 3rd clean step after the overflow"
    assert s.clean_steps == 0, "growth restarts the clean-step count"


def test_growth_stops_at_max_scale():
    s = LossScaler(init_scale=4.0, growth_interval=1, max_scale=10.0)
    assert feed(s, "...") == [8.0, 10.0, 10.0], "scale must be clamped to max_scale"


def test_backoff_stops_at_min_scale_and_reports_being_stuck():
    s = LossScaler(init_scale=4.0, min_scale=1.5)
    outcomes = [s.update(True) for _ in range(4)]
    assert [o.new_scale for o in outcomes] == [2.0, 1.5, 1.5, 1.5], "never below min_scale"
    assert [o.stuck_at_min_scale for o in outcomes] == [False, False, True, True], \
        "stuck only when an overflow happens while already at min_scale"
    assert all(o.skipped for o in outcomes) and s.skipped_steps == 4, "every overflow skips"


def test_hysteresis_tolerates_overflows_until_the_nth():
    s = LossScaler(init_scale=64.0, hysteresis=3, growth_interval=100)
    assert feed(s, "oo") == [64.0, 64.0], "the first two overflows are tolerated"
    assert feed(s, "o") == [32.0], "the third one backs off"
    assert feed(s, ".oo.o") == [32.0, 32.0, 32.0, 32.0, 16.0], \
        "the count restarts after a scale change and clean steps do not reset it"
    assert s.skipped_steps == 6, "tolerated overflows are still skipped steps"


def test_static_mode_never_changes_the_scale_but_counts_skips():
    s = LossScaler(init_scale=128.0, dynamic=False, growth_interval=1)
    assert feed(s, "o..o.") == [128.0] * 5, "static scale must never move"
    assert s.skipped_steps == 2 and s.steps == 5


def test_history_records_each_change_with_reason():
    s = LossScaler(init_scale=8.0, growth_interval=2)
    feed(s, "o..")
    assert list(s.history) == [(1, 4.0, "overflow"), (3, 8.0, "growth")], \
        "history must list (step, new scale, reason)"
    s2 = LossScaler(init_scale=8.0, growth_interval=1, max_scale=2.0 ** 30, min_scale=1.0)
    feed(s2, "o." * (HISTORY_LENGTH + 5))
    assert len(s2.history) == HISTORY_LENGTH, "history is bounded"


def test_state_dict_round_trip_continues_identically():
    a = LossScaler(init_scale=256.0, growth_interval=3, hysteresis=2)
    feed(a, "o.o..o")
    b = LossScaler()
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict(), "loaded state must equal the saved one"
    tail = "..o.o...."
    assert feed(b, tail) == feed(a, tail), "a resumed scaler must behave like the original"


@pytest.mark.parametrize("bad", [
    {"scale": -1.0}, {"clean_steps": -3}, {"hysteresis": 0}, {"min_scale": 10.0, "scale": 5.0},
])
def test_bad_state_raises_and_changes_nothing(bad):
    s = LossScaler(init_scale=32.0)
    feed(s, "o.")
    before = s.state_dict()
    state = dict(before, **bad)
    with pytest.raises(ValueError):
        s.load_state_dict(state)
    assert s.state_dict() == before, "a rejected state must leave the scaler untouched"


def test_state_with_missing_or_unknown_keys_is_rejected():
    s = LossScaler()
    state = s.state_dict()
    del state["scale"]
    with pytest.raises(ValueError, match="missing keys \\['scale'\\]"):
        s.load_state_dict(state)
    with pytest.raises(ValueError, match="unknown keys \\['bogus'\\]"):
        s.load_state_dict(dict(s.state_dict(), bogus=1))
    with pytest.raises(TypeError, match="dict"):
        s.load_state_dict([("scale", 1.0)])


@pytest.mark.parametrize("kwargs, error, text", [
    ({"init_scale": 0.0}, ValueError, "init_scale"),
    ({"init_scale": float("inf")}, ValueError, "init_scale"),
    ({"init_scale": "big"}, TypeError, "init_scale"),
    ({"growth_factor": 1.0}, ValueError, "growth_factor"),
    ({"backoff_factor": 1.5}, ValueError, "backoff_factor"),
    ({"growth_interval": 0}, ValueError, "growth_interval"),
    ({"growth_interval": 2.5}, ValueError, "growth_interval"),
    ({"hysteresis": True}, ValueError, "hysteresis"),
    ({"min_scale": 4.0, "max_scale": 2.0}, ValueError, "min_scale"),
    ({"init_scale": 2.0 ** 30}, ValueError, "outside"),
])
def test_bad_options_name_the_problem(kwargs, error, text):
    with pytest.raises(error, match=text):
        LossScaler(**kwargs)


def test_scale_setter_validates():
    s = LossScaler(init_scale=8.0, max_scale=64.0)
    s.scale = 32.0
    with pytest.raises(ValueError, match="outside"):
        s.scale = 128.0
    outcome = s.update(found_overflow=True)      # backoff_factor 0.5 (the default)
    assert (outcome.old_scale, outcome.new_scale) == (32.0, 16.0), (
        "the step must run at the assigned 32 (the rejected 128 not stored) and back off from "
        "it: %s" % (outcome,))
