"""Declared parameter rules: definition checks, the ParameterRule view, and run-time coercion and rule checks."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings, strategies as st

from qag.errors import QagError
from qag.sql.params import Resolver, compile_rules, display, display_rule, normalise, validate_definitions


def definition_errors(parameters, used=None) -> QagError:
    with pytest.raises(QagError) as caught:
        validate_definitions(parameters, used if used is not None else list(parameters))
    assert caught.value.code == "invalid_body"
    assert caught.value.status == 400
    return caught.value


def one_definition_error(spec) -> str:
    return definition_errors({"p": spec}).extras["errors"]["p"]


def refusal(rules, values, used=None) -> QagError:
    with pytest.raises(QagError) as caught:
        compile_rules(rules).resolve(values, used)
    assert caught.value.status == 400
    return caught.value


def problems(rules, values) -> dict:
    return refusal(rules, values).extras["errors"]


# ------------------------------------------------------------------------------------------------------------
# validate_definitions
# ------------------------------------------------------------------------------------------------------------

class TestDefinitions:
    @pytest.mark.parametrize("given, stored", [
        ("int", "integer"), ("INTEGER", "integer"), ("Float", "number"), ("number", "number"),
        ("str", "string"), ("String", "string"), ("bool", "boolean"), ("BOOLEAN", "boolean"),
    ])
    def test_type_names_are_case_insensitive_and_stored_canonically(self, given, stored):
        assert validate_definitions({"p": given}, ["p"]) == {"p": {"type": stored, "required": True}}
        assert validate_definitions({"p": {"type": given}}, ["p"]) == {"p": {"type": stored, "required": True}}

    def test_untyped_rule(self):
        assert validate_definitions({"p": {}}, ["p"]) == {"p": {"type": None, "required": True}}
        assert validate_definitions({"p": {"type": None}}, ["p"]) == {"p": {"type": None, "required": True}}

    @pytest.mark.parametrize("absent", [None, {}, [], ""])
    def test_no_declarations(self, absent):
        assert validate_definitions(absent, ["x"]) == {}

    @pytest.mark.parametrize("body", ["int", ["int"], 5, True])
    def test_parameters_must_be_an_object(self, body):
        with pytest.raises(QagError) as caught:
            validate_definitions(body, [])
        assert caught.value.code == "invalid_body"
        assert caught.value.message == "query_parameters must be a JSON object"

    def test_unknown_type(self):
        assert one_definition_error("uuid") == "has unknown type 'uuid' (use int, float, str or bool)"
        assert one_definition_error({"type": "uuid"}) == "has unknown type 'uuid' (use int, float, str or bool)"
        assert one_definition_error({"type": 5}).startswith("has unknown type '5'")

    def test_rule_must_be_a_type_name_or_object(self):
        assert one_definition_error(5) == "must be a type name such as 'int' or an object of rules"
        assert one_definition_error(["int"]) == "must be a type name such as 'int' or an object of rules"

    @pytest.mark.parametrize("key", ["embed", "nullable", "minimum"])
    def test_unknown_rule_keys_refused(self, key):
        message = one_definition_error({"type": "str", key: "x"})
        assert message.startswith(f"has unknown rule(s): {key} (allowed: ")

    @pytest.mark.parametrize("name", ["1x", "a-b", "a b", "", "é", "x\n"])
    def test_parameter_names(self, name):
        errors = definition_errors({name: "int"}, [name]).extras["errors"]
        assert errors[name].startswith("is not a valid parameter name")

    def test_word_characters_after_the_first_are_allowed(self):
        assert validate_definitions({"_aé9": "int"}, ["_aé9"]) == {"_aé9": {"type": "integer", "required": True}}

    def test_required(self):
        assert validate_definitions({"p": {"required": False}}, ["p"])["p"]["required"] is False
        assert one_definition_error({"required": "yes"}) == "'required' must be true or false"
        assert one_definition_error({"required": 1}) == "'required' must be true or false"

    def test_default_makes_optional_unless_required_given(self):
        assert validate_definitions({"p": {"type": "int", "default": 3}}, ["p"]) == {
            "p": {"type": "integer", "required": False, "default": 3}}
        assert validate_definitions({"p": {"type": "int", "default": 3, "required": False}}, ["p"])["p"][
            "required"] is False

    def test_required_with_default_refused(self):
        assert one_definition_error({"type": "int", "default": 3, "required": True}) == \
            "cannot be both 'required' and have a 'default'"

    @pytest.mark.parametrize("type_name", ["int", "float", None])
    def test_min_max_for_numbers(self, type_name):
        stored = validate_definitions({"p": {"type": type_name, "min": 1, "max": 2.5}}, ["p"])["p"]
        assert (stored["min"], stored["max"]) == (1, 2.5)

    @pytest.mark.parametrize("type_name", ["str", "bool"])
    def test_min_max_not_for_text_or_booleans(self, type_name):
        assert one_definition_error({"type": type_name, "min": 1}) == \
            "'min' only applies to numbers (use min_length/max_length for text)"
        assert one_definition_error({"type": type_name, "max": 1}).startswith("'max' only applies to numbers")

    @pytest.mark.parametrize("bound", [True, "1", None, [1], float("inf"), float("nan"), 10 ** 400])
    def test_min_max_must_be_numbers(self, bound):
        assert one_definition_error({"type": "int", "min": bound}) == "'min' must be a number"
        assert one_definition_error({"type": "int", "max": bound}) == "'max' must be a number"

    def test_min_not_above_max(self):
        assert one_definition_error({"type": "int", "min": 5, "max": 4}) == "'min' must not be greater than 'max'"
        assert validate_definitions({"p": {"type": "int", "min": 4, "max": 4}}, ["p"])["p"]["min"] == 4

    @pytest.mark.parametrize("type_name", ["str", None])
    def test_lengths_for_text(self, type_name):
        stored = validate_definitions({"p": {"type": type_name, "min_length": 0, "max_length": 3}}, ["p"])["p"]
        assert (stored["min_length"], stored["max_length"]) == (0, 3)

    @pytest.mark.parametrize("type_name", ["int", "float", "bool"])
    def test_lengths_only_for_text(self, type_name):
        assert one_definition_error({"type": type_name, "min_length": 1}) == "'min_length' only applies to text"
        assert one_definition_error({"type": type_name, "max_length": 1}) == "'max_length' only applies to text"

    @pytest.mark.parametrize("bound", [-1, 1.0, True, "2", None])
    def test_lengths_must_be_non_negative_integers(self, bound):
        assert one_definition_error({"type": "str", "min_length": bound}) == \
            "'min_length' must be a non-negative integer"
        assert one_definition_error({"type": "str", "max_length": bound}) == \
            "'max_length' must be a non-negative integer"

    def test_min_length_not_above_max_length(self):
        assert one_definition_error({"type": "str", "min_length": 3, "max_length": 2}) == \
            "'min_length' must not be greater than 'max_length'"

    def test_pattern(self):
        assert validate_definitions({"p": {"type": "str", "pattern": "[a-z]+"}}, ["p"])["p"]["pattern"] == "[a-z]+"
        assert validate_definitions({"p": {"pattern": "a" * 500}}, ["p"])["p"]["pattern"] == "a" * 500
        assert one_definition_error({"pattern": "a" * 501}) == "'pattern' must be text of at most 500 characters"
        assert one_definition_error({"pattern": 5}) == "'pattern' must be text of at most 500 characters"
        assert one_definition_error({"type": "int", "pattern": "1"}) == "'pattern' only applies to text"
        assert one_definition_error({"pattern": "(a"}).startswith("'pattern' is not a valid regular expression (")
        # re.compile raises OverflowError, not re.error, for this one
        assert one_definition_error({"pattern": "a{4294967296}"}).startswith("'pattern' is not a valid regular")

    def test_enum_values_are_coerced(self):
        assert validate_definitions({"p": {"type": "int", "enum": ["1", 2]}}, ["p"])["p"]["enum"] == [1, 2]
        assert validate_definitions({"p": {"type": "bool", "enum": ["yes"]}}, ["p"])["p"]["enum"] == [True]
        assert validate_definitions({"p": {"enum": ["G", 1, True]}}, ["p"])["p"]["enum"] == ["G", 1, True]

    @pytest.mark.parametrize("enum", [[], "G", None, {"a": 1}])
    def test_enum_must_be_a_non_empty_list(self, enum):
        assert one_definition_error({"type": "str", "enum": enum}) == "'enum' must be a non-empty list"

    def test_enum_values_must_coerce(self):
        assert one_definition_error({"type": "int", "enum": [1, "x"]}) == \
            "has an 'enum' value that must be an integer"
        assert one_definition_error({"type": "str", "enum": [5]}) == "has an 'enum' value that must be text"

    def test_default_must_satisfy_every_rule(self):
        assert validate_definitions({"p": {"type": "int", "default": "5"}}, ["p"])["p"]["default"] == 5
        assert one_definition_error({"type": "int", "min": 1, "default": 0}) == \
            "has a 'default' that must be at least 1"
        assert one_definition_error({"type": "str", "enum": ["G"], "default": "X"}) == \
            "has a 'default' that must be one of: G"
        assert one_definition_error({"type": "int", "default": None}) == "has a 'default' that must be an integer"
        assert one_definition_error({"type": "str", "pattern": "[a-z]+", "default": "A"}) == \
            "has a 'default' that must match the pattern [a-z]+"

    def test_example_must_satisfy_every_rule_and_is_stored(self):
        stored = validate_definitions({"p": {"type": "float", "example": "1e3"}}, ["p"])["p"]
        assert stored == {"type": "number", "required": True, "example": 1000.0}
        assert one_definition_error({"type": "str", "max_length": 2, "example": "abc"}) == \
            "has an 'example' that must be at most 2 characters long"

    def test_description(self):
        assert validate_definitions({"p": {"description": "d"}}, ["p"])["p"]["description"] == "d"
        assert one_definition_error({"description": 5}) == "'description' must be text"

    def test_declared_but_unused_b5_5(self):
        error = definition_errors({"idd": "int"}, ["id"])
        assert error.message == ("query_parameters declares idd, which sql_query does not use "
                                 "(write :name in it, or remove the declaration)")
        assert list(error.extras["errors"]) == ["idd"]

    def test_text_placeholder_counts_as_use(self):
        # the caller passes every placeholder the SQL uses, `{name}` ones included
        assert validate_definitions({"id": "int"}, ["id"]) == {"id": {"type": "integer", "required": True}}

    def test_unused_check_can_be_skipped(self):
        assert validate_definitions({"idd": "int"}, None) == {"idd": {"type": "integer", "required": True}}

    def test_all_problems_reported_together(self):
        error = definition_errors({"a": "uuid", "b": {"type": "int", "min": "x"}, "c": "int", "d": "str"},
                                  ["a", "b", "d"])
        assert error.extras["errors"] == {
            "a": "has unknown type 'uuid' (use int, float, str or bool)",
            "b": "'min' must be a number",
            "c": "is not used by sql_query (write :c in it, or remove the declaration)",
        }
        assert error.message == ("Invalid query_parameters: a has unknown type 'uuid' (use int, float, str or bool);"
                                 " b 'min' must be a number;"
                                 " c is not used by sql_query (write :c in it, or remove the declaration)")

    def test_stored_form_is_json_and_revalidates_to_itself(self):
        body = {"rating": {"type": "str", "enum": ["G", "PG"], "default": "PG", "description": "MPAA"},
                "n": {"type": "int", "min": 1, "max": 60, "example": "7"},
                "t": {"min_length": 2, "max_length": 4, "pattern": "[a-z]+", "required": False}}
        stored = validate_definitions(body, list(body))
        assert json.loads(json.dumps(stored)) == stored
        assert validate_definitions(stored, list(body)) == stored
        assert list(stored) == ["rating", "n", "t"]
        assert stored["n"] == {"type": "integer", "required": True, "min": 1, "max": 60, "example": 7}


# ------------------------------------------------------------------------------------------------------------
# display / normalise
# ------------------------------------------------------------------------------------------------------------

class TestDisplay:
    def test_parameter_rule_view(self):
        stored = validate_definitions({
            "n": {"type": "int", "default": "5", "min": 1, "example": 3},
            "s": "str",
            "u": {"required": False, "description": "free"},
        }, ["n", "s", "u"])
        assert display(stored) == {
            "n": {"type": "integer", "required": False, "default": 5, "min": 1},
            "s": {"type": "string", "required": True},
            "u": {"type": None, "required": False, "description": "free"},
        }

    def test_key_order(self):
        rule = display_rule({"type": "str", "description": "d", "pattern": "x+", "max_length": 9, "min_length": 1,
                             "enum": ["xx"], "default": "xx"})
        assert list(rule) == ["type", "required", "default", "enum", "min_length", "max_length", "pattern",
                              "description"]

    def test_unusable_stored_definitions_degrade(self):
        assert display({"a": "uuid", "b": {"type": "int", "bogus": 1}, "c": 7}) == {
            "a": {"type": None, "required": True}, "b": {"type": None, "required": True},
            "c": {"type": None, "required": True}}
        assert display(None) == {} and display(["x"]) == {}

    def test_normalise_keeps_the_example(self):
        assert normalise({"type": "int", "example": "4"}) == {"type": "integer", "required": True, "example": 4}


# ------------------------------------------------------------------------------------------------------------
# Resolver: presence, null, defaults
# ------------------------------------------------------------------------------------------------------------

MIN_ID = {"min_id": {"type": "int", "min": 1, "max": 25, "default": 1}}


class TestResolvePresence:
    def test_b3_8_absent_uses_default(self):
        assert compile_rules(MIN_ID).resolve({}) == {"min_id": 1}

    def test_b3_8_below_min(self):
        error = refusal(MIN_ID, {"min_id": "0"})
        assert error.code == "param_invalid"
        assert error.extras == {"errors": {"min_id": "must be at least 1"}}
        assert error.message == "Invalid parameters: min_id must be at least 1"

    def test_b3_8_not_an_integer_and_above_max(self):
        assert problems(MIN_ID, {"min_id": "abc"}) == {"min_id": "must be an integer"}
        assert problems(MIN_ID, {"min_id": "26"}) == {"min_id": "must be at most 25"}
        assert compile_rules(MIN_ID).resolve({"min_id": "25"}) == {"min_id": 25}

    def test_b3_9_two_bad_and_one_missing_in_declaration_order(self):
        rules = {"a": "int", "b": {"type": "str", "enum": ["G", "PG"]}, "c": "bool"}
        error = refusal(rules, {"b": "X", "a": "x"})
        assert error.code == "param_invalid"
        assert error.extras["errors"] == {"a": "must be an integer", "b": "must be one of: G, PG",
                                          "c": "is required"}
        assert error.message == ("Invalid parameters: a must be an integer; b must be one of: G, PG; "
                                 "c is required")

    def test_b3_10_only_missing_is_param_required(self):
        error = refusal({"a": "int", "b": "str", "c": {"required": False}}, {})
        assert error.code == "param_required"
        assert error.extras["errors"] == {"a": "is required", "b": "is required"}
        assert error.message == "Invalid parameters: a is required; b is required"

    def test_b3_11_body_text_for_int(self):
        assert problems(MIN_ID, {"min_id": "x"}) == {"min_id": "must be an integer"}

    def test_b3_12_json_types_are_kept(self):
        assert problems({"n": "int"}, {"n": True}) == {"n": "must be an integer"}
        assert problems({"b": "bool"}, {"b": 1}) == {"b": "must be true or false"}
        assert problems({"s": "str"}, {"s": 5}) == {"s": "must be text"}

    def test_b3_13_beyond_64_bits(self):
        assert problems({"n": "int"}, {"n": "9223372036854775808"}) == {"n": "must be a 64-bit integer"}
        assert problems({"n": "int"}, {"n": -9223372036854775809}) == {"n": "must be a 64-bit integer"}
        assert compile_rules({"n": "int"}).resolve({"n": "-9223372036854775808"}) == {"n": -(2 ** 63)}
        # longer than int()'s digit limit: still an integer, still reported as out of range
        assert problems({"n": "int"}, {"n": "9" * 5000}) == {"n": "must be a 64-bit integer"}

    def test_optional_absent_binds_none(self):
        assert compile_rules({"p": {"type": "int", "required": False}}).resolve({}) == {"p": None}

    def test_null(self):
        assert problems({"p": "int"}, {"p": None}) == {"p": "must not be null"}
        assert refusal({"p": "int"}, {"p": None}).code == "param_invalid"
        # an explicit null on an optional parameter is NULL, not the default
        assert compile_rules({"p": {"type": "int", "default": 4}}).resolve({"p": None}) == {"p": None}

    def test_empty_query_string_value_is_present(self):
        assert problems(MIN_ID, {"min_id": ""}) == {"min_id": "must be an integer"}
        assert compile_rules({"s": "str"}).resolve({"s": ""}) == {"s": ""}

    def test_undeclared_values_pass_through_untouched(self):
        values = {"x": "5", "y": [1], "min_id": "3"}
        assert compile_rules(MIN_ID).resolve(values) == {"x": "5", "y": [1], "min_id": 3}
        assert values == {"x": "5", "y": [1], "min_id": "3"}  # the caller's dict is not changed

    def test_declared_but_unused_is_not_enforced(self):
        rules = {"a": "int", "b": "int"}
        with pytest.raises(QagError):
            compile_rules(rules).resolve({"a": "1", "b": "x"})
        assert compile_rules(rules).resolve({"a": "1", "b": "x"}, used_names={"a"}) == {"a": 1, "b": "x"}
        assert compile_rules(rules, used_names=["a"]).resolve({"a": "1", "b": "x"}) == {"a": 1, "b": "x"}
        assert compile_rules(rules, used_names=["a"]).names == ("a",)

    def test_no_rules(self):
        resolver = compile_rules(None)
        assert isinstance(resolver, Resolver) and not resolver
        assert resolver.resolve({"a": "1"}) == {"a": "1"}
        assert compile_rules("garbage").resolve({}) == {}

    def test_claim_bound_parameters_are_listed_for_the_run_handler(self):
        resolver = compile_rules({"tenant": {"type": "int", "from_claim": "tenant_id"}, "q": "str"})
        assert resolver.claim_bound == (("tenant", "tenant_id", "integer"),)
        assert compile_rules({"q": "str"}).claim_bound == ()

    def test_unusable_claim_bound_rule_stays_claim_bound(self):
        # degrading it to an ordinary parameter would let the request choose a value meant to identify the caller
        resolver = compile_rules({"tenant": {"type": "uuid", "from_claim": "tenant_id"}})
        assert resolver.claim_bound == (("tenant", "tenant_id", None),)

    def test_unusable_stored_rule_degrades_to_untyped_required(self):
        resolver = compile_rules({"a": {"type": "uuid"}, "b": {"type": "int", "min": "x"}})
        assert problems({"a": {"type": "uuid"}}, {}) == {"a": "is required"}
        assert resolver.resolve({"a": "x", "b": "y"}) == {"a": "x", "b": "y"}
        assert problems({"a": 5}, {"a": [1]}) == {"a": "must be text, a number or true/false"}


# ------------------------------------------------------------------------------------------------------------
# Resolver: coercion table
# ------------------------------------------------------------------------------------------------------------

def resolved(type_name, value):
    return compile_rules({"p": type_name}).resolve({"p": value})["p"]


class TestCoercion:
    @pytest.mark.parametrize("text, number", [
        ("42", 42), (" 42 ", 42), ("+7", 7), ("-7", -7), ("1_000", 1000), ("0", 0), ("\t5\n", 5),
    ])
    def test_integer_text(self, text, number):
        value = resolved("int", text)
        assert value == number and type(value) is int

    @pytest.mark.parametrize("text", ["", "abc", "3.0", "1e3", "1__0", "0x10", "_1", "1 2", "true"])
    def test_integer_text_refused(self, text):
        assert problems({"p": "int"}, {"p": text}) == {"p": "must be an integer"}

    @pytest.mark.parametrize("value", [True, False, 3.0, 2.5, [1], {"a": 1}])
    def test_integer_json_refused(self, value):
        assert problems({"p": "int"}, {"p": value}) == {"p": "must be an integer"}

    def test_integer_json(self):
        assert resolved("int", 12) == 12

    @pytest.mark.parametrize("text, number", [("1.5", 1.5), ("1e3", 1000.0), (" -2 ", -2.0), ("1_0.5", 10.5)])
    def test_number_text(self, text, number):
        value = resolved("float", text)
        assert value == number and type(value) is float

    @pytest.mark.parametrize("value", ["", "abc", "nan", "inf", "-Infinity", "1e400", True, False, float("nan"),
                                       float("inf"), 10 ** 400, [1.0]])
    def test_number_refused(self, value):
        assert problems({"p": "number"}, {"p": value}) == {"p": "must be a number"}

    def test_number_json_keeps_its_value(self):
        assert resolved("float", 3) == 3 and type(resolved("float", 3)) is int
        assert resolved("float", 2.5) == 2.5

    @pytest.mark.parametrize("text, flag", [
        ("true", True), ("TRUE", True), (" yes ", True), ("1", True), ("Yes", True),
        ("false", False), ("No", False), ("0", False), (" FALSE\t", False),
    ])
    def test_boolean_text(self, text, flag):
        assert resolved("bool", text) is flag

    @pytest.mark.parametrize("value", ["on", "off", "", "y", "t", "2", 1, 0, 1.0, [True]])
    def test_boolean_refused(self, value):
        assert problems({"p": "bool"}, {"p": value}) == {"p": "must be true or false"}

    def test_boolean_json(self):
        assert resolved("bool", True) is True and resolved("bool", False) is False

    @pytest.mark.parametrize("value", [5, 1.5, True, [], {}])
    def test_string_only_text(self, value):
        assert problems({"p": "str"}, {"p": value}) == {"p": "must be text"}

    def test_string_text(self):
        assert resolved("str", " x ") == " x "

    @pytest.mark.parametrize("value", ["x", True, 3, -2.5])
    def test_untyped_scalars(self, value):
        assert resolved({}, value) == value

    @pytest.mark.parametrize("value", [[1], {"a": 1}, float("nan"), float("-inf"), 10 ** 400])
    def test_untyped_refused(self, value):
        assert problems({"p": {}}, {"p": value}) == {"p": "must be text, a number or true/false"}


# ------------------------------------------------------------------------------------------------------------
# Resolver: rule checks
# ------------------------------------------------------------------------------------------------------------

class TestRules:
    def test_enum(self):
        rules = {"r": {"type": "str", "enum": ["G", "PG"]}}
        assert compile_rules(rules).resolve({"r": "PG"}) == {"r": "PG"}
        assert problems(rules, {"r": "pg"}) == {"r": "must be one of: G, PG"}

    def test_enum_numbers_compare_by_value(self):
        rules = {"n": {"type": "float", "enum": [1, 2.5]}}
        assert compile_rules(rules).resolve({"n": "1"}) == {"n": 1.0}
        assert problems(rules, {"n": "2"}) == {"n": "must be one of: 1, 2.5"}

    def test_untyped_enum_does_not_confuse_booleans_and_numbers(self):
        rules = {"u": {"enum": [1, "a"]}}
        assert compile_rules(rules).resolve({"u": 1}) == {"u": 1}
        assert problems(rules, {"u": True}) == {"u": "must be one of: 1, a"}
        assert problems(rules, {"u": "1"}) == {"u": "must be one of: 1, a"}
        assert problems({"u": {"enum": [False]}}, {"u": 0}) == {"u": "must be one of: False"}

    @pytest.mark.parametrize("bound, printed", [
        (1, "1"), (0.5, "0.5"), (1e6, "1e+06"), (-3, "-3"), (1234567, "1.23457e+06"),
    ])
    def test_bounds_are_printed_in_g_form(self, bound, printed):
        below, above = {"n": bound - 1}, {"n": bound + 1}
        assert problems({"n": {"type": "float", "min": bound}}, below) == {"n": f"must be at least {printed}"}
        assert problems({"n": {"type": "float", "max": bound}}, above) == {"n": f"must be at most {printed}"}

    def test_min_before_max_and_bounds_inclusive(self):
        rules = {"n": {"type": "int", "min": 1, "max": 60}}
        assert compile_rules(rules).resolve({"n": "1"}) == {"n": 1}
        assert compile_rules(rules).resolve({"n": 60}) == {"n": 60}
        assert problems(rules, {"n": "61"}) == {"n": "must be at most 60"}

    def test_enum_is_checked_before_bounds(self):
        rules = {"n": {"type": "int", "enum": [1, 100], "max": 60}}
        assert problems(rules, {"n": "2"}) == {"n": "must be one of: 1, 100"}
        assert problems(rules, {"n": "100"}) == {"n": "must be at most 60"}

    def test_lengths_in_code_points(self):
        rules = {"t": {"type": "str", "min_length": 2, "max_length": 4}}
        assert problems(rules, {"t": "a"}) == {"t": "must be at least 2 characters long"}
        assert problems(rules, {"t": "abcde"}) == {"t": "must be at most 4 characters long"}
        assert compile_rules(rules).resolve({"t": "héé😀"}) == {"t": "héé😀"}  # 4 code points, more bytes

    def test_pattern_full_match(self):
        rules = {"t": {"type": "str", "pattern": "[a-z]+"}}
        assert compile_rules(rules).resolve({"t": "abc"}) == {"t": "abc"}
        assert problems(rules, {"t": "abc1"}) == {"t": "must match the pattern [a-z]+"}
        assert problems(rules, {"t": "1abc"}) == {"t": "must match the pattern [a-z]+"}
        assert problems({"t": {"pattern": "a|b"}}, {"t": "ab"}) == {"t": "must match the pattern a|b"}

    def test_a_pattern_that_backtracks_without_end_is_cut_short(self):
        """'(a|aa)+' against a's then a b backtracks for hours in re (holding the interpreter lock, so every thread
        of the worker): the check has a time limit, the value is refused, and other threads run meanwhile."""
        import threading
        import time
        rules = {"t": {"type": "str", "pattern": "(a|aa)+"}}
        assert compile_rules(rules).resolve({"t": "aaaa"}) == {"t": "aaaa"}
        ticks = []
        stop = threading.Event()

        def tick():
            while not stop.is_set():
                ticks.append(1)
                time.sleep(0.001)
        other = threading.Thread(target=tick)
        other.start()
        try:
            started = time.monotonic()
            assert problems(rules, {"t": "a" * 60 + "b"}) == {
                "t": "must match the pattern (a|aa)+ (its check took longer than 0.1 s)"}
            assert time.monotonic() - started < 5      # 2**60 steps otherwise
        finally:
            stop.set()
            other.join()
        assert len(ticks) > 10                          # the other thread ran while the check did

    def test_length_before_pattern(self):
        rules = {"t": {"type": "str", "max_length": 2, "pattern": "[a-z]+"}}
        assert problems(rules, {"t": "ABC"}) == {"t": "must be at most 2 characters long"}

    def test_untyped_rules_apply_by_kind(self):
        rules = {"u": {"min": 5, "max_length": 2}}
        resolver = compile_rules(rules)
        assert problems(rules, {"u": "abc"}) == {"u": "must be at most 2 characters long"}
        assert problems(rules, {"u": 4}) == {"u": "must be at least 5"}
        assert resolver.resolve({"u": "1"}) == {"u": "1"}  # text: numeric bounds do not apply
        assert resolver.resolve({"u": 400}) == {"u": 400}  # number: length rules do not apply


# ------------------------------------------------------------------------------------------------------------
# Properties
# ------------------------------------------------------------------------------------------------------------

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=6)
type_names = st.sampled_from([None, "int", "integer", "float", "number", "str", "string", "bool", "boolean"])
rule_objects = st.fixed_dictionaries({}, optional={
    "type": type_names, "required": st.booleans(), "default": json_scalars, "example": json_scalars,
    "enum": st.lists(json_scalars, min_size=1, max_size=3), "min": st.integers(-10, 10) | st.floats(-10, 10),
    "max": st.integers(-10, 10) | st.floats(-10, 10), "min_length": st.integers(0, 4),
    "max_length": st.integers(0, 4), "pattern": st.sampled_from(["[a-z]+", "\\d*", "x|y"]),
    "description": st.text(max_size=5),
})
rule_maps = st.dictionaries(st.sampled_from(["a", "b", "c"]), type_names.filter(bool) | rule_objects, max_size=3)


@given(st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1), st.sampled_from(["", " ", "\t"]),
       st.booleans())
def test_any_64_bit_integer_text_round_trips(number, padding, plus):
    sign = "+" if plus and number >= 0 else ""
    value = resolved("int", f"{padding}{sign}{number}{padding}")
    assert value == number and type(value) is int


@given(st.integers(min_value=2 ** 63, max_value=2 ** 200)
       | st.integers(min_value=-(2 ** 200), max_value=-(2 ** 63) - 1))
def test_integers_outside_64_bits_are_refused(number):
    assert problems({"p": "int"}, {"p": str(number)}) == {"p": "must be a 64-bit integer"}
    assert problems({"p": "int"}, {"p": number}) == {"p": "must be a 64-bit integer"}


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_any_finite_float_text_round_trips(number):
    assert resolved("float", repr(number)) == number


@settings(max_examples=300)
@given(rule_maps, st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), json_values, max_size=4),
       st.none() | st.sets(st.sampled_from(["a", "b", "c"])))
def test_resolve_only_ever_raises_qag_errors(rules, values, used):
    try:
        out = compile_rules(rules).resolve(values, used)
    except QagError as error:
        assert error.code in ("param_required", "param_invalid")
        assert error.message == "Invalid parameters: " + "; ".join(
            f"{name} {message}" for name, message in error.extras["errors"].items())
        assert (error.code == "param_required") == all(m == "is required" for m in error.extras["errors"].values())
    else:
        assert set(out) >= set(values)
        for name in set(values) - set(rules):
            assert out[name] is values[name]


@settings(max_examples=300)
@given(rule_maps)
def test_valid_definitions_are_json_and_stable(rules):
    try:
        stored = validate_definitions(rules, list(rules))
    except QagError as error:
        assert error.code == "invalid_body" and set(error.extras["errors"]) <= set(rules)
        return
    assert json.loads(json.dumps(stored, allow_nan=False)) == stored
    assert validate_definitions(stored, list(rules)) == stored
    # a stored default always satisfies the rules it is stored with
    resolver = compile_rules(stored)
    defaults = {name: rule["default"] for name, rule in stored.items() if "default" in rule}
    assert {k: v for k, v in resolver.resolve(defaults, used_names=defaults).items()} == defaults
    for rule in stored.values():
        for value in (rule.get("default"), rule.get("example")):
            assert not (isinstance(value, float) and not math.isfinite(value))


class TestFromClaim:
    def test_from_claim_is_stored_and_shown(self):
        assert normalise({"type": "str", "from_claim": "sub"}) == {"type": "string", "required": True,
                                                                    "from_claim": "sub"}

    @pytest.mark.parametrize("claim", ["", "  ", 5, ["sub"], "x" * 201])
    def test_from_claim_must_be_a_claim_name(self, claim):
        assert one_definition_error({"type": "str", "from_claim": claim}).startswith("'from_claim' must be a claim name")

    def test_from_claim_with_a_default_is_refused(self):
        assert one_definition_error({"type": "str", "from_claim": "sub", "default": "x"}) == (
            "cannot have both 'from_claim' and a 'default'")
