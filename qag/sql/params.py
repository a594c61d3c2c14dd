"""Declared parameter rules: strict checks when a version is saved; a resolver compiled per version for each call."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any

import regex

from qag.errors import QagError

__all__ = ["validate_definitions", "display", "display_rule", "normalise", "compile_rules", "Resolver"]

# Both the short and the JSON type names are accepted on input (case-insensitive); the JSON ones are stored.
_TYPE_NAMES = {"int": "integer", "integer": "integer", "float": "number", "number": "number",
               "str": "string", "string": "string", "bool": "boolean", "boolean": "boolean"}
# `embed` belongs to a feature qag does not have (embeddings): accepting it silently would store a rule qag cannot
# honour, so it is refused. `from_claim` names the sign-in token claim a parameter's value comes from (qag/bearer.py).
_RULE_KEYS = ("default", "description", "enum", "example", "from_claim", "max", "max_length", "min", "min_length",
              "pattern", "required", "type")
_MAX_CLAIM_NAME = 200
_RULE_KEY_SET = frozenset(_RULE_KEYS)
_NAME = re.compile(r"[A-Za-z_]\w*")  # used with fullmatch: `$` would also accept a trailing newline
_MAX_PATTERN_LENGTH = 500
# A pattern is matched by the regex module (re's syntax), with a time limit and without the interpreter lock: a
# pattern that backtracks without end ('(a|aa)+' against 'aaa...b') held re's match, and every thread of the
# worker, for as long as a caller's value made it take.
_PATTERN_SECONDS = 0.1
_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1
_TRUE_WORDS = frozenset(("true", "1", "yes"))
_FALSE_WORDS = frozenset(("false", "0", "no"))

_MUST_INTEGER = "must be an integer"
_MUST_INT64 = "must be a 64-bit integer"
_MUST_NUMBER = "must be a number"
_MUST_BOOLEAN = "must be true or false"
_MUST_TEXT = "must be text"
_MUST_SCALAR = "must be text, a number or true/false"
_IS_REQUIRED = "is required"
_NOT_NULL = "must not be null"
_ABSENT = object()


class _Bad(Exception):
    """A value or definition that breaks a rule; the message completes the sentence '<name> ...'."""


# --- Coercion, one function per type ---
# Exact-type tests come first because query-string values are always plain str and JSON values plain
# int/float/bool; isinstance only runs for the rare subclass.

def _coerce_integer(value: Any) -> int:
    cls = type(value)
    if cls is str or (cls is not int and isinstance(value, str)):
        try:
            number = int(value)  # accepts surrounding spaces, a sign and 1_000, as QueryAPIGate does
        except ValueError:
            raise _Bad(_integer_text_problem(value)) from None
    elif cls is int:
        number = value
    elif isinstance(value, int) and cls is not bool:
        number = int(value)
    else:
        raise _Bad(_MUST_INTEGER)
    # Outside signed 64 bits no driver can bind the value: refuse it here as a 400 naming the parameter,
    # rather than letting it fail inside the database call as a 500.
    if _INT64_MIN <= number <= _INT64_MAX:
        return number
    raise _Bad(_MUST_INT64)


def _integer_text_problem(text: str) -> str:
    # int() refuses texts longer than sys.get_int_max_str_digits(); such a run of digits is still an integer,
    # just far outside 64 bits, and saying so is more useful than "must be an integer".
    digits = text.strip()
    if digits[:1] in ("+", "-"):
        digits = digits[1:]
    return _MUST_INT64 if len(digits) > 19 and digits.isdecimal() else _MUST_INTEGER


def _finite(number: Any) -> bool:
    try:
        return math.isfinite(number)
    except OverflowError:  # an int too large for a float: no driver binds it as a number
        return False


def _coerce_number(value: Any) -> int | float:
    cls = type(value)
    if cls is str or (cls is not int and cls is not float and isinstance(value, str)):
        try:
            value = float(value)
        except ValueError:
            raise _Bad(_MUST_NUMBER) from None
    elif cls is not int and cls is not float and (cls is bool or not isinstance(value, (int, float))):
        raise _Bad(_MUST_NUMBER)
    if _finite(value):
        return value
    raise _Bad(_MUST_NUMBER)


def _coerce_boolean(value: Any) -> bool:
    if value is True or value is False:
        return value
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
    raise _Bad(_MUST_BOOLEAN)


def _coerce_string(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise _Bad(_MUST_TEXT)


def _coerce_untyped(value: Any) -> Any:
    if isinstance(value, (str, bool)):
        return value
    if isinstance(value, (int, float)) and _finite(value):
        return value
    raise _Bad(_MUST_SCALAR)


_COERCERS: dict[str | None, Callable[[Any], Any]] = {
    "integer": _coerce_integer, "number": _coerce_number, "boolean": _coerce_boolean,
    "string": _coerce_string, None: _coerce_untyped,
}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# --- A parsed rule and its compiled checker ---

class _Rule:
    """One parameter's normalised definition."""

    __slots__ = ("type", "required", "has_default", "default", "enum", "min", "max", "min_length", "max_length",
                 "pattern", "description", "has_example", "example", "from_claim", "_check")

    def __init__(self, type_name: str | None = None) -> None:
        self.type = type_name
        self.required = True
        self.has_default = False
        self.default: Any = None
        self.enum: list | None = None
        self.min: int | float | None = None
        self.max: int | float | None = None
        self.min_length: int | None = None
        self.max_length: int | None = None
        self.pattern: str | None = None
        self.description: str | None = None
        self.has_example = False
        self.example: Any = None
        self.from_claim: str | None = None
        self._check: Callable[[Any], Any] | None = None

    def checker(self) -> Callable[[Any], Any]:
        """value → the value coerced to the type with every rule applied; raises _Bad. Built once."""
        if self._check is None:
            self._check = self._compile()
        return self._check

    def check(self, value: Any) -> Any:
        return self.checker()(value)

    def _compile(self) -> Callable[[Any], Any]:
        coerce = _COERCERS[self.type]
        steps = self._steps()
        if not steps:
            return coerce  # the common case: a bare type, nothing to check after coercion
        if len(steps) == 1:
            (step,) = steps

            def check_one(value: Any) -> Any:
                value = coerce(value)
                step(value)
                return value
            return check_one

        def check_all(value: Any) -> Any:
            value = coerce(value)
            for each in steps:
                each(value)
            return value
        return check_all

    def _steps(self) -> list[Callable[[Any], None]]:
        """The rule checks, in the contract's order: enum, min, max, min_length, max_length, pattern."""
        steps: list[Callable[[Any], None]] = []
        if self.enum is not None:
            steps.append(_enum_step(self.type, self.enum))
        if self.min is not None:
            low, message = self.min, f"must be at least {self.min:g}"

            def check_min(value: Any) -> None:
                if _is_number(value) and value < low:
                    raise _Bad(message)
            steps.append(check_min)
        if self.max is not None:
            high, message_max = self.max, f"must be at most {self.max:g}"

            def check_max(value: Any) -> None:
                if _is_number(value) and value > high:
                    raise _Bad(message_max)
            steps.append(check_max)
        if self.min_length is not None:
            shortest, message_short = self.min_length, f"must be at least {self.min_length} characters long"

            def check_min_length(value: Any) -> None:
                if isinstance(value, str) and len(value) < shortest:
                    raise _Bad(message_short)
            steps.append(check_min_length)
        if self.max_length is not None:
            longest, message_long = self.max_length, f"must be at most {self.max_length} characters long"

            def check_max_length(value: Any) -> None:
                if isinstance(value, str) and len(value) > longest:
                    raise _Bad(message_long)
            steps.append(check_max_length)
        if self.pattern is not None:
            fullmatch, message_pattern = regex.compile(self.pattern).fullmatch, f"must match the pattern {self.pattern}"
            message_slow = f"{message_pattern} (its check took longer than {_PATTERN_SECONDS:g} s)"

            def check_pattern(value: Any) -> None:
                if isinstance(value, str):
                    try:
                        matched = fullmatch(value, timeout=_PATTERN_SECONDS, concurrent=True)
                    except TimeoutError:
                        raise _Bad(message_slow) from None
                    if matched is None:
                        raise _Bad(message_pattern)
            steps.append(check_pattern)
        return steps

    def stored(self) -> dict:
        """The JSON-serialisable form the store keeps (and that parses back to this same rule)."""
        out: dict[str, Any] = {"type": self.type, "required": self.required}
        if self.has_default:
            out["default"] = self.default
        for key in ("enum", "min", "max", "min_length", "max_length", "pattern", "description"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.has_example:
            out["example"] = self.example
        if self.from_claim is not None:
            out["from_claim"] = self.from_claim
        return out


def _enum_step(type_name: str | None, allowed: list) -> Callable[[Any], None]:
    message = "must be one of: " + ", ".join(str(v) for v in allowed)
    if type_name is None:
        # Untyped values mix kinds, and True == 1 in Python: tag booleans so `true` never passes for an enum of 1.
        tagged = frozenset((type(v) is bool, v) for v in allowed)

        def check_untyped(value: Any) -> None:
            if (type(value) is bool, value) not in tagged:
                raise _Bad(message)
        return check_untyped
    members = frozenset(allowed)  # after coercion every value has the one declared kind, so plain equality is right

    def check_typed(value: Any) -> None:
        if value not in members:
            raise _Bad(message)
    return check_typed


def _parse(spec: Any) -> _Rule:
    """A definition as written (type name or object of rules) → _Rule; raises _Bad naming the first problem."""
    if isinstance(spec, str):
        spec = {"type": spec}
    elif not isinstance(spec, dict):
        raise _Bad("must be a type name such as 'int' or an object of rules")
    unknown = sorted(str(key) for key in spec if key not in _RULE_KEY_SET)
    if unknown:
        raise _Bad(f"has unknown rule(s): {', '.join(unknown)} (allowed: {', '.join(_RULE_KEYS)})")

    type_name = None
    declared_type = spec.get("type")
    if declared_type is not None:
        type_name = _TYPE_NAMES.get(declared_type.lower()) if isinstance(declared_type, str) else None
        if type_name is None:
            raise _Bad(f"has unknown type '{declared_type}' (use int, float, str or bool)")
    rule = _Rule(type_name)

    if "required" in spec:
        if not isinstance(spec["required"], bool):
            raise _Bad("'required' must be true or false")
        rule.required = spec["required"]
    elif "default" in spec:
        rule.required = False
    if "description" in spec and spec["description"] is not None:
        if not isinstance(spec["description"], str):
            raise _Bad("'description' must be text")
        rule.description = spec["description"]

    numeric = type_name in (None, "integer", "number")
    textual = type_name in (None, "string")
    for key in ("min", "max"):
        if key in spec:
            if not numeric:
                raise _Bad(f"'{key}' only applies to numbers (use min_length/max_length for text)")
            if not (_is_number(spec[key]) and _finite(spec[key])):
                raise _Bad(f"'{key}' must be a number")
            setattr(rule, key, spec[key])
    if rule.min is not None and rule.max is not None and rule.min > rule.max:
        raise _Bad("'min' must not be greater than 'max'")
    for key in ("min_length", "max_length"):
        if key in spec:
            if not textual:
                raise _Bad(f"'{key}' only applies to text")
            bound = spec[key]
            if not isinstance(bound, int) or isinstance(bound, bool) or bound < 0:
                raise _Bad(f"'{key}' must be a non-negative integer")
            setattr(rule, key, bound)
    if rule.min_length is not None and rule.max_length is not None and rule.min_length > rule.max_length:
        raise _Bad("'min_length' must not be greater than 'max_length'")
    if "pattern" in spec:
        if not textual:
            raise _Bad("'pattern' only applies to text")
        pattern = spec["pattern"]
        if not isinstance(pattern, str) or len(pattern) > _MAX_PATTERN_LENGTH:
            raise _Bad(f"'pattern' must be text of at most {_MAX_PATTERN_LENGTH} characters")
        try:
            re.compile(pattern)      # Python's syntax (contract 3.5.2), which the regex module reads alike
            regex.compile(pattern)
        except (re.error, regex.error, OverflowError, RecursionError, ValueError) as error:
            # OverflowError: a repeat count like a{4294967296}; RecursionError: absurdly deep nesting
            raise _Bad(f"'pattern' is not a valid regular expression ({error})") from None
        rule.pattern = pattern

    if "enum" in spec:
        values = spec["enum"]
        if not isinstance(values, list) or not values:
            raise _Bad("'enum' must be a non-empty list")
        coerce = _COERCERS[type_name]
        try:
            rule.enum = [coerce(v) for v in values]
        except _Bad as error:
            raise _Bad(f"has an 'enum' value that {error}") from None
    if spec.get("from_claim") is not None:
        claim = spec["from_claim"]
        if not isinstance(claim, str) or not claim.strip() or len(claim) > _MAX_CLAIM_NAME:
            raise _Bad(f"'from_claim' must be a claim name (text of 1 to {_MAX_CLAIM_NAME} characters)")
        if "default" in spec:
            # The value comes from the token or the call is refused: a default would stand in for a missing claim.
            raise _Bad("cannot have both 'from_claim' and a 'default'")
        rule.from_claim = claim
    if "default" in spec:
        if spec.get("required") is True:
            raise _Bad("cannot be both 'required' and have a 'default'")
        try:
            rule.default = rule.check(spec["default"])
        except _Bad as error:
            raise _Bad(f"has a 'default' that {error}") from None
        rule.has_default = True
    if "example" in spec:
        # An example is published in /openapi.json: a wrong one would mislead callers, so it must pass the rules.
        try:
            rule.example = rule.check(spec["example"])
        except _Bad as error:
            raise _Bad(f"has an 'example' that {error}") from None
        rule.has_example = True
    return rule


def _parse_lenient(spec: Any) -> _Rule:
    """Run-time reading: a stored definition that no longer parses degrades to untyped and required, so a query
    saved by an older version (or edited behind the API) keeps running instead of failing every call."""
    try:
        return _parse(spec)
    except Exception:  # noqa: BLE001 - stored data may be anything; any failure means "unusable"
        rule = _Rule(None)
        if isinstance(spec, dict) and spec.get("from_claim"):
            # Degrading a claim-bound rule to an ordinary parameter would let the request choose a value meant to
            # identify the caller: it stays claim-bound (an unusable claim name simply finds no claim).
            rule.from_claim = str(spec["from_claim"])
        return rule


# --- Public: definitions (management API) ---

def _unused_message(name: str) -> str:
    return f"is not used by sql_query (write :{name} in it, or remove the declaration)"


def validate_definitions(parameters: Any, used_names: Collection[str] | None) -> dict:
    """Check a `parameters` value from a management body and return its normalised stored form.

    Every problem is reported at once: QagError("invalid_body", summary, errors={name: message}).
    `used_names` are the placeholders the SQL uses (`:name` and `{name}`); None skips the "declared but unused"
    check. A falsy value (absent, null, {}, [], "") means no declarations, as QueryAPIGate reads it.
    """
    if not parameters:
        return {}
    if not isinstance(parameters, dict):
        raise QagError("invalid_body", "query_parameters must be a JSON object")
    used = None if used_names is None else frozenset(used_names)
    errors: dict[str, str] = {}
    unused: list[str] = []
    stored: dict[str, dict] = {}
    for name, spec in parameters.items():
        if not isinstance(name, str) or _NAME.fullmatch(name) is None:
            errors[str(name)] = ("is not a valid parameter name (letters, digits and underscores; "
                                 "not starting with a digit)")
            continue
        try:
            stored[name] = _parse(spec).stored()
        except _Bad as error:
            errors[name] = str(error)
            continue
        if used is not None and name not in used:
            errors[name] = _unused_message(name)
            unused.append(name)
    if not errors:
        return stored
    if len(unused) == len(errors):
        # Only undeclared-use problems: QueryAPIGate's own sentence, which its tests pin.
        message = (f"query_parameters declares {', '.join(sorted(unused))}, which sql_query does not use "
                   "(write :name in it, or remove the declaration)")
    else:
        message = "Invalid query_parameters: " + "; ".join(f"{name} {problem}" for name, problem in errors.items())
    raise QagError("invalid_body", message, errors=errors)


def normalise(spec: Any) -> dict:
    """One stored definition read leniently, in stored form (type, required, then the rules that are set)."""
    return _parse_lenient(spec).stored()


def display_rule(spec: Any) -> dict:
    """One stored definition as the API's ParameterRule: type and required always, other rules only when set."""
    rule = _parse_lenient(spec).stored()
    rule.pop("example", None)  # stored and published in /openapi.json, but not part of ParameterRule
    return rule


def catalog_rules(stored: Any, placeholders: Collection[str] = ()) -> dict:
    """A version's parameters as /catalog shows them (contract 11): each parameter's whole rule record, every field
    present, set or not (`embed` is QueryAPIGate's; qag does not have it). As QueryAPIGate 0.43 lists them: every
    placeholder in the version's order, an undeclared one untyped and required (what a run asks of it), then any
    declaration its SQL no longer uses."""
    if not isinstance(stored, dict):
        stored = {}
    out = {}
    for name in (*placeholders, *stored):
        if name in out:
            continue
        rule = _parse_lenient(stored[name]) if name in stored else _Rule(None)
        out[name] = {field: getattr(rule, field) for field in _Rule.__slots__ if field not in ("_check", "from_claim")}
        out[name].update(embed=False, from_claim=rule.from_claim)
    return out


def display(stored: Any) -> dict:
    """A version's stored `parameters` map as {name: ParameterRule}."""
    if not isinstance(stored, dict):
        return {}
    return {name: display_rule(spec) for name, spec in stored.items()}


# --- Public: run time ---

class Resolver:
    """A version's declared parameters compiled for run time; build once per version with compile_rules()."""

    __slots__ = ("_plan", "names", "claim_bound")

    def __init__(self, plan: tuple[tuple[str, bool, bool, Any, Callable[[Any], Any]], ...],
                 claim_bound: tuple[tuple[str, str, str | None], ...] = ()) -> None:
        self._plan = plan
        self.names = tuple(entry[0] for entry in plan)
        # (parameter, claim name, declared type) of every `from_claim` parameter: filled by the run handler.
        self.claim_bound = claim_bound

    def __bool__(self) -> bool:
        return bool(self._plan)

    def resolve(self, values: Mapping[str, Any], used_names: Collection[str] | None = None) -> dict:
        """All values to bind: declared ones coerced and checked, defaults (or None) filled in for absent optional
        ones, undeclared ones untouched. Declared names outside `used_names` are not enforced (None: all are).
        Raises QagError param_required (only missing ones) or param_invalid listing every failure."""
        out = dict(values)
        errors: dict[str, str] | None = None
        for name, required, has_default, default, check in self._plan:
            if used_names is not None and name not in used_names:
                continue
            value = out.get(name, _ABSENT)
            if value is _ABSENT:
                if has_default:
                    out[name] = default
                elif required:
                    if errors is None:
                        errors = {}
                    errors[name] = _IS_REQUIRED
                else:
                    out[name] = None
            elif value is None:
                if required:
                    if errors is None:
                        errors = {}
                    errors[name] = _NOT_NULL
            elif check is _coerce_string and type(value) is str:
                pass  # plain text parameter given text: nothing to convert, skip the call
            else:
                try:
                    out[name] = check(value)
                except _Bad as error:
                    if errors is None:
                        errors = {}
                    errors[name] = error.args[0]
        if errors:
            _fail(errors)
        return out


def _fail(errors: dict[str, str]) -> None:
    code = "param_required" if all(m == _IS_REQUIRED for m in errors.values()) else "param_invalid"
    message = "Invalid parameters: " + "; ".join(f"{name} {problem}" for name, problem in errors.items())
    raise QagError(code, message, errors=errors)


def compile_rules(stored: Any, used_names: Collection[str] | None = None) -> Resolver:
    """Compile a version's stored `parameters` (read leniently) into a Resolver. With `used_names`, declarations
    the SQL does not use are dropped now instead of being skipped on every call."""
    if not isinstance(stored, dict):
        return Resolver(())
    plan, bound = [], []
    for name, spec in stored.items():
        if used_names is not None and name not in used_names:
            continue
        rule = _parse_lenient(spec)
        plan.append((name, rule.required, rule.has_default, rule.default, rule.checker()))
        if rule.from_claim is not None:
            bound.append((name, rule.from_claim, rule.type))
    return Resolver(tuple(plan), tuple(bound))
