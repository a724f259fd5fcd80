"""Policy options: declared next to each policy, checked there, and taken by name in `create_policy`."""

import math

import pytest

from fleet.schedule import POLICIES, OptionError, create_policy, policy_options
from fleet.schedule.planners import FleetAdaptive, FleetGlobal, FleetLocal
from fleet.schedule.planners.adaptive import FleetAdaptiveOptions
from fleet.schedule.planners.fleet_global import FleetGlobalOptions


def test_an_option_the_policy_does_not_take_is_named_with_the_policy_and_its_options():
    with pytest.raises(OptionError) as err:
        create_policy("fleet-l", alpha=0.5)
    assert err.value.option == "alpha"
    assert str(err.value) == "option 'alpha': policy 'fleet-l' takes no such option (its options: delta)"


def test_a_policy_without_options_refuses_every_option():
    for name in ("baseline", "homogeneous"):
        with pytest.raises(OptionError, match=f"option 'delta': policy '{name}' takes no such option "
                                              r"\(it takes none\)"):
            create_policy(name, delta=5.0)


def test_an_option_of_another_policy_is_refused():
    with pytest.raises(OptionError, match="policy 'fleet-g' takes no such option .*alpha, delta"):
        create_policy("fleet-g", window=3)


def test_options_not_given_take_the_declared_defaults():
    assert policy_options("fleet-g", {}) == FleetGlobalOptions(alpha=0.8, delta=None)
    chosen = policy_options("fleet-adaptive", {"window": 3})
    assert chosen == FleetAdaptiveOptions(window=3) and chosen.target_factor == 1.7 and chosen.extra_gpus == 2
    policy = create_policy("fleet-g")
    assert (policy.alpha, policy.delta) == (0.8, None)


def test_given_options_reach_the_policy():
    fleet_g = create_policy("fleet-g", alpha=0.5, delta=3)
    assert isinstance(fleet_g, FleetGlobal) and (fleet_g.alpha, fleet_g.delta) == (0.5, 3.0)
    assert create_policy("fleet-l", delta=2.5).delta == 2.5
    adaptive = create_policy("fleet-adaptive", window=3, match_tolerance=0.2, hard_tolerance=0.4)
    assert isinstance(adaptive, FleetAdaptive)
    assert (adaptive.matcher.window, adaptive.matcher.tolerance, adaptive.matcher.hard_tolerance) == (3, 0.2, 0.4)


@pytest.mark.parametrize(
    "name, options, message",
    [
        ("fleet-g", {"alpha": 0}, "option 'alpha': must be a number > 0 and <= 1, got 0"),
        ("fleet-g", {"alpha": 1.5}, "option 'alpha': must be a number > 0 and <= 1, got 1.5"),
        ("fleet-g", {"alpha": "0.5"}, "option 'alpha': must be a number > 0 and <= 1, got '0.5'"),
        ("fleet-g", {"alpha": True}, "option 'alpha': must be a number > 0 and <= 1, got True"),
        ("fleet-g", {"alpha": math.nan}, "option 'alpha': must be a number > 0 and <= 1, got nan"),
        ("fleet-l", {"delta": -1}, "option 'delta': must be a number > 0, or null, got -1"),
        ("fleet-adaptive", {"window": 2.5}, "option 'window': must be an integer >= 1, got 2.5"),
        ("fleet-adaptive", {"extra_gpus": -1}, "option 'extra_gpus': must be an integer >= 0, got -1"),
        ("fleet-adaptive", {"target_factor": 0.9}, "option 'target_factor': must be a number >= 1, got 0.9"),
        ("fleet-adaptive", {"hard_tolerance": 0.05},
         "option 'hard_tolerance': must be at least match_tolerance (0.1), got 0.05"),
        ("fleet-adaptive", {"tight_tolerance": 0.2},
         "option 'tight_tolerance': must be at most match_tolerance (0.1), got 0.2"),
    ],
)
def test_values_are_checked_by_the_policys_declaration(name, options, message):
    with pytest.raises(OptionError) as err:
        create_policy(name, **options)
    assert str(err.value) == message


def test_whole_numbers_given_for_a_number_option_are_held_as_floats():
    policy = create_policy("fleet-g", alpha=1)
    assert policy.alpha == 1.0 and isinstance(policy.alpha, float)


def test_constructors_take_the_declared_options_directly():
    assert FleetLocal(FleetLocal.Options(delta=4.0)).delta == 4.0
    assert FleetGlobal().alpha == 0.8


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_documents_each_option_it_declares(name):
    options = POLICIES[name].Options
    doc = options.__doc__ or ""
    for option in options.names():
        assert f"        {option}:" in doc, f"{options.__name__} does not document {option!r}"


def test_an_unknown_policy_lists_the_registry():
    with pytest.raises(KeyError, match="unknown policy 'fleet-x'; valid: " + ", ".join(POLICIES)):
        create_policy("fleet-x")
