"""Typed mode options: declared once (the controller's typed keyword parameters), parsed once."""

from __future__ import annotations

import pytest

from umctl import UmctlError
from umctl.controller import available_modes, make_controller
from umctl.controller.base import Controller
from umctl.controller.options import TYPES, declared, mode_options, parse_mode_options


def test_every_registered_mode_declares_typed_options():
    for mode in available_modes():
        for spec in mode_options(mode).values():
            assert spec.type in TYPES
            assert isinstance(spec.default, spec.type) or (spec.type is float and isinstance(spec.default, int))


def test_values_take_the_declared_type():
    got = parse_mode_options(["deepum.degree=8", "deepum.whole_tables=true", "oracle.reserve_frac=0.25",
                              "deepum.exec_fallback=off"], ["none", "deepum", "oracle"])
    assert got["deepum"] == {"degree": 8, "whole_tables": True, "exec_fallback": False}
    assert type(got["deepum"]["degree"]) is int
    assert got["oracle"] == {"reserve_frac": 0.25} and got["none"] == {}
    make_controller("deepum", **got["deepum"])  # the constructor takes what was parsed


def test_unqualified_key_goes_to_every_mode_that_declares_it():
    got = parse_mode_options(["num_rows=512"], ["deepum", "deepum-prefetch", "oracle"])
    assert got == {"deepum": {"num_rows": 512}, "deepum-prefetch": {"num_rows": 512}, "oracle": {}}


def test_degree_is_parsed_against_the_declaration():
    assert parse_mode_options(None, ["deepum"], degree=8) == {"deepum": {"degree": 8}}
    with pytest.raises(UmctlError, match="--degree: mode snurhac has no prefetch degree"):
        parse_mode_options(None, ["snurhac"], degree=8)


@pytest.mark.parametrize("item, message", [
    ("deepum.degree=x", "-O deepum.degree=x: option degree takes an int (default 32), got 'x'"),
    ("deepum.degree=4.5", "option degree takes an int"),
    ("deepum.whole_tables=maybe", "option whole_tables takes a bool"),
    ("oracle.reserve_frac=lots", "option reserve_frac takes a float"),
    ("deepum.options=1", "no mode among deepum takes option 'options'"),   # the **options catch-all is no option
    ("deepum.nope=1", "no mode among deepum takes option 'nope' (options: adaptive_whole, assoc,"),
    ("hum.degree=1", "names mode 'hum', which is not being run"),
    ("degree", "bad mode option 'degree'"),
])
def test_bad_options_are_one_line_errors(item, message):
    with pytest.raises(UmctlError) as e:
        parse_mode_options([item], ["deepum", "oracle"])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_an_untyped_option_is_a_declaration_bug():
    class Untyped(Controller):
        def __init__(self, depth=3, **options):
            super().__init__(**options)

    with pytest.raises(TypeError, match="option depth must be declared"):
        declared(Untyped)
