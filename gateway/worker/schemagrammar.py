"""JSON schemas to GBNF: llama-cpp-python's converter, with these things done our way.

- **Integer bounds.** The converter writes any integer for ``{"type": "integer", "minimum": 1,
  "maximum": 12}``, so a model sampled under it could break the schema it was given.
  ``Converter`` writes a bounded integer as digit ranges: ``int_range(lo, hi)`` matches exactly
  the decimal spellings of lo..hi (no leading zeros, no "-0"), in rules linear in the number of
  digits. The integers written have at most ``schemacheck.MAX_INT_DIGITS`` digits: a bound
  farther out is no bound on that side (every integer written still meets it).
- **Repetitions.** The converter writes ``maxLength``, ``maxItems`` and a pattern's ``{m,n}`` as
  one nested optional group per allowed repetition, which llama.cpp's parser recursed through
  until the worker's stack overflowed. ``repetition`` writes GBNF's own ``{m,n}`` (as llama.cpp's
  own converter does), which the parser unrolls into flat rules; an array's items repeat as one
  rule so that llama.cpp's count of rules per repetition stays one.
- **References.** ``$ref`` is followed within the schema (``#``, ``#/...``), from anywhere in it
  (the converter did not look beside a ``$ref``, so a top-level one with ``$defs`` failed).
- **Strings.** A string holds only what ``strictjson`` reads back (``CHAR``): no raw control
  character, no lone UTF-16 surrogate escape, where the library's rule allowed both.
- **Any value.** A schema that allows any JSON value (``schemacheck.allows_any``: ``{}``,
  ``true``, no ``type`` and nothing that shapes a value) is written as any JSON value; the
  converter refused one with only a ``description`` and wrote ``{}`` as an object. ``false``
  allows nothing: a ``ValueError``.

What a schema may ask (counts, bounds, references) is checked before this runs, in the HTTP
process (``schemacheck``). Imported by the worker only: it loads llama_cpp.
"""

from __future__ import annotations

import re
from typing import Any

from llama_cpp import llama_grammar

from ..text.grammar import MAX_REPEAT
from ..text.schemacheck import LARGEST_INT, allows_any, integer_bounds, ref_parts, resolve


def repetition(item: str, least: int, most: int | None) -> str:
    """GBNF for ``least`` to ``most`` (None: any number) of ``item`` (one GBNF term). A most past
    ``MAX_REPEAT`` is written as no most, as llama.cpp would read it; a least past it is a
    ``ValueError`` (llama.cpp cannot write that many)."""
    if least > MAX_REPEAT:
        raise ValueError(f"asks for at least {least} of an item; at most {MAX_REPEAT} can be written")
    if most is not None and most > MAX_REPEAT:
        most = None
    if most is not None and most < least:
        raise ValueError(f"asks for at least {least} and at most {most} of an item")
    if most == least:
        return "" if least == 0 else item if least == 1 else f"{item}{{{least}}}"
    if most is None:
        return f"{item}*" if least == 0 else f"{item}+" if least == 1 else f"{item}{{{least},}}"
    return f"{item}?" if (least, most) == (0, 1) else f"{item}{{{least},{most}}}"


def _library_repetition(item_rule: str, min_items: Any, max_items: Any, separator_rule: str | None = None,
                        item_rule_is_literal: bool = False) -> str:
    """llama-cpp-python's ``_build_repetition``, written with ``repetition``. Only a pattern's
    quantifiers reach it (``Converter`` writes strings and arrays itself), never with a separator;
    with one, the separated items are a group (which llama.cpp may refuse past a few hundred)."""
    least, most = int(min_items), None if max_items is None else int(max_items)
    if not separator_rule:
        return repetition(item_rule, least, most)
    if most == 0:
        return ""
    rest = repetition(f"({separator_rule} {item_rule})", max(least - 1, 0), None if most is None else most - 1)
    body = f"{item_rule} {rest}"
    return f"({body})?" if least == 0 else body


# The converter's patterns call the module's function: it is replaced for every converter in the
# worker, where only this module uses one.
llama_grammar._build_repetition = _library_repetition


def _digits(x: int, y: int) -> str:
    return f'"{x}"' if x == y else f"[{x}-{y}]"


def _any(n: int, most: int | None = None) -> str:
    """GBNF for ``n`` digits (``n`` to ``most``, if given)."""
    if most is not None and most != n:
        return f"[0-9]{{{n},{most}}}"
    return "" if n == 0 else "[0-9]" if n == 1 else f"[0-9]{{{n}}}"


def _seq(*terms: str) -> str:
    return " ".join(t for t in terms if t)


def _at_least(s: str) -> str:
    """The strings of len(s) digits that are >= s, one level of nesting per digit."""
    head, rest = int(s[0]), s[1:]
    if not rest.strip("0"):
        return _seq(_digits(head, 9), _any(len(rest)))
    alts = [_seq(f'"{head}"', f"({_at_least(rest)})")]
    if head < 9:
        alts.append(_seq(_digits(head + 1, 9), _any(len(rest))))
    return " | ".join(alts)


def _at_most(s: str) -> str:
    """The strings of len(s) digits that are <= s, one level of nesting per digit."""
    head, rest = int(s[0]), s[1:]
    if not rest.strip("9"):
        return _seq(_digits(0, head), _any(len(rest)))
    if not s.strip("0"):
        return f'"{s}"'
    alts = [_seq(_digits(0, head - 1), _any(len(rest)))] if head > 0 else []
    alts.append(_seq(f'"{head}"', f"({_at_most(rest)})"))
    return " | ".join(alts)


def _same_length(a: str, b: str) -> str:
    """Decimal strings of one length from ``a`` to ``b`` (a <= b), as a GBNF expression."""
    i = 0
    while i < len(a) and a[i] == b[i]:
        i += 1
    if i == len(a):
        return f'"{a}"'
    prefix = f'"{a[:i]}"' if i else ""
    x, y, low, high = int(a[i]), int(b[i]), a[i + 1:], b[i + 1:]
    from_low, to_high = not low.strip("0"), not high.strip("9")  # whole digit ranges at either end
    alts = [] if from_low else [_seq(f'"{x}"', f"({_at_least(low)})")]
    first, last = x if from_low else x + 1, y if to_high else y - 1
    if first <= last:
        alts.append(_seq(_digits(first, last), _any(len(low))))
    if not to_high:
        alts.append(_seq(f'"{y}"', f"({_at_most(high)})"))
    body = " | ".join(alts)
    return _seq(prefix, f"({body})") if prefix or len(alts) > 1 else body


def _unsigned(lo: int, hi: int) -> list[str]:
    """Alternatives for lo..hi (0 <= lo <= hi): one for the lengths whose every number is in the
    range, and a digit range for a first or last length that is only partly in it."""
    a, b = str(lo), str(hi)
    if len(a) == len(b):
        return [_same_length(a, b)]
    whole_from = len(a) if a == "1" + "0" * (len(a) - 1) else len(a) + 1  # the shortest length taken whole
    whole_to = len(b) if b == "9" * len(b) else len(b) - 1
    out = [] if whole_from == len(a) else [_same_length(a, "9" * len(a))]
    if whole_from <= whole_to:
        out.append(_seq("[1-9]", _any(whole_from - 1, whole_to - 1)))
    if whole_to < len(b):
        out.append(_same_length("1" + "0" * (len(b) - 1), b))
    return out


def int_range(lo: int, hi: int) -> str:
    """GBNF for the integers lo..hi (lo <= hi), linear in their number of digits."""
    alts = []
    if lo < 0:
        alts.append(f'"-" ({" | ".join(_unsigned(max(1, -hi), -lo))})')
    if hi >= 0:
        alts += _unsigned(max(lo, 0), hi)
    return " | ".join(f"({alt})" for alt in alts)


_CHOSEN_FIRST = ("$ref", "oneOf", "anyOf", "const", "enum")  # the converter's branches before a type's


# A JSON string's character as the gateway's parser reads a model's call back (``strictjson``):
# no raw control character (JSON forbids them; llama.cpp's own converter leaves them out too),
# and a \u escape never a lone UTF-16 surrogate (a high one only with its low one), where the
# library's rule allowed both, and a model sampled under it wrote a call that was then refused.
CHAR = llama_grammar.BuiltinRule(
    r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" ('
    r' [0-9a-cA-Ce-fE-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F]'
    r' | [dD] [0-7] [0-9a-fA-F] [0-9a-fA-F]'
    r' | [dD] [89abAB] [0-9a-fA-F] [0-9a-fA-F] "\\u" [dD] [c-fC-F] [0-9a-fA-F] [0-9a-fA-F]))',
    [])


class Converter(llama_grammar.SchemaConverter):
    def _add_primitive(self, name: str, rule: llama_grammar.BuiltinRule) -> str:
        """The library's primitive rules, but ``CHAR`` for a string's character wherever one is
        needed (a string property, an object's keys, any value)."""
        return super()._add_primitive(name, CHAR if name == "char" else rule)

    def __init__(self) -> None:
        super().__init__(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
        self._ref_rules: dict[str, str] = {}  # absolute reference -> its rule's name

    def resolve_refs(self, schema: dict, url: str) -> dict:
        """Each local ``$ref`` in ``schema`` made absolute (``url#/...``) and its target noted,
        wherever it is; any other reference is a ``ValueError``."""
        stack: list[Any] = [schema]
        while stack:
            node = stack.pop()
            if isinstance(node, list):
                stack += node
            elif isinstance(node, dict):
                ref = node.get("$ref")
                if isinstance(ref, str) and not ref.startswith(url + "#"):
                    target = resolve(schema, ref)
                    if ref_parts(ref) is None or target is None:
                        raise ValueError(f"`$ref` {ref[:60]!r} points at no schema within this one")
                    node["$ref"] = url + ref
                    self._refs[node["$ref"]] = target
                stack += node.values()
        return schema

    def _resolve_ref(self, ref: str) -> str:
        """The rule for what ``ref`` points at, made once and named after the whole reference
        (the converter named it by its last part, so two tools' ``#/$defs/item`` shared a rule);
        a reference met again while its rule is being made (recursion) names the same rule."""
        name = self._ref_rules.get(ref)
        if name is None:
            url, pointer = ref.split("#", 1)
            base = llama_grammar.INVALID_RULE_CHARS_RE.sub("-", f"{url}-{pointer.rsplit('/', 1)[-1] or 'root'}")
            name, i = base, 0
            while name in self._rules or name in self._ref_rules.values() or name in llama_grammar.RESERVED_NAMES:
                name, i = f"{base}{i}", i + 1
            self._ref_rules[ref] = name
            self._ref_rules[ref] = name = self.visit(self._refs[ref], name)
        return name

    def visit(self, schema: Any, name: str) -> str:
        rule_name = name + "-" if name in llama_grammar.RESERVED_NAMES else name or "root"
        if allows_any(schema):
            return self._add_rule(rule_name, self._add_primitive("value", llama_grammar.PRIMITIVE_RULES["value"]))
        if schema is False:
            raise ValueError("the schema `false` allows no value")
        if not isinstance(schema, dict) or any(k in schema for k in _CHOSEN_FIRST):
            return super().visit(schema, name)
        kind = schema.get("type")
        if kind == "integer":
            low, high = integer_bounds(schema)
            if low is not None or high is not None:
                low = max(-LARGEST_INT, low if low is not None else -LARGEST_INT)
                high = min(LARGEST_INT, high if high is not None else LARGEST_INT)
                if low > high:
                    raise ValueError(f"no integer of at most {len(str(LARGEST_INT))} digits meets the bounds of "
                                     f"{str(schema)[:200]}")
                return self._add_rule(rule_name, f"({int_range(low, high)}) space")
        elif kind == "string" and ("minLength" in schema or "maxLength" in schema) and "pattern" not in schema \
                and not re.match(r"^uuid[1-5]?$", str(schema.get("format") or "")) \
                and f"{schema.get('format')}-string" not in llama_grammar.STRING_FORMAT_RULES:
            char = self._add_primitive("char", llama_grammar.PRIMITIVE_RULES["char"])
            chars = repetition(char, int(schema.get("minLength", 0)), _most(schema, "maxLength"))
            return self._add_rule(rule_name, _seq(r'"\""', chars, r'"\"" space'))
        elif (kind == "array" or (kind is None and not _object(schema))) and isinstance(schema.get("items"), dict):
            return self._add_rule(rule_name, self._array(schema, name))
        return super().visit(schema, name)

    def _array(self, schema: dict[str, Any], name: str) -> str:
        """``[item, ...]`` from ``minItems`` to ``maxItems`` items; the items after the first
        repeat as one rule (``"," item``) and the items as another, so that each of llama.cpp's
        repetitions repeats a single rule."""
        base = f"{name}{'-' if name else ''}"
        item = self.visit(schema["items"], f"{base}item")
        least, most = int(schema.get("minItems", 0)), _most(schema, "maxItems")
        if most == 0:
            return '"[" space "]" space'
        more = self._add_rule(f"{base}more", f'"," space {item}')
        items = self._add_rule(f"{base}items", _seq(item, repetition(more, max(least - 1, 0),
                                                                     None if most is None else most - 1)))
        return f'"[" space {items}{"?" if least == 0 else ""} "]" space'


def _object(schema: dict[str, Any]) -> bool:
    """Whether the converter writes an untyped schema as an object (its branches before arrays')."""
    return "properties" in schema or "allOf" in schema or (
        "additionalProperties" in schema and schema["additionalProperties"] is not True)


def _most(schema: dict[str, Any], key: str) -> int | None:
    return None if schema.get(key) is None else int(schema[key])


def schema_grammar(schema: dict[str, Any]) -> str:
    """The GBNF of a whole JSON schema (``response_format``'s)."""
    conv = Converter()
    conv.visit(conv.resolve_refs(schema, "input"), "")
    return conv.format_grammar()
