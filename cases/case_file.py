"""Cases from a TOML file (``--cases-file``): your own cases, beside the named suites.

Two kinds of entry, as arrays of tables, in any number::

    [[case]]                      # one case: the fields of cases.case.Case
    op = "simple_gla"
    variant = "chunk"
    B = 1
    T = 80
    H = 1
    K = 128
    V = 128
    dtype = "bfloat16"            # or its label: "bf16", "fp32", "fp16"
    gate = "g=logsigmoid/16"      # a gate label as in case ids, a table of Gate fields, or false (gate-less op)
    gamma = "g_gamma=halfnormal/2"   # optional: a second gate, g_gamma, beside a g gate (both at once)
    chunk_size = 64
    h0 = true
    dht = true

    [[case]]
    id = "gla.chunk/B1-T80-H1-K128-V128/bf16/g_gamma=alibi(L32,l0)/C64/h0"   # or the id alone

    [[grid]]                      # every combination of the list-valued fields (cartesian product)
    op = "kda"
    variant = "chunk"
    B = 1
    T = [64, 80]
    H = 1
    K = 128
    V = 128
    dtype = ["bfloat16", "float32"]
    options = [{}, {use_qk_l2norm_in_kernel = true}]   # a list of tables varies the options

Fields and their defaults are :class:`cases.case.Case`'s: ``op``, ``variant``, ``B``, ``T``, ``H``, ``K``,
``V`` (required), ``dtype`` ("bfloat16"), ``gate`` (``g=logsigmoid/16``), ``gamma`` (none: the g_gamma gate
of a case with both gates, beside a g ``gate``), ``chunk_size`` (64), ``h0``
(false), ``final_state`` (true), ``dht`` (false), ``scale`` (K**-0.5), ``seed`` (0), ``options`` (a table
of the op's options, name = value), ``lens`` (packed sequence lengths, a list of ints). With ``lens``, ``T``
defaults to ``sum(lens)`` and ``B`` to 1. In a ``[[grid]]`` a list is the values a field takes; ``lens``
varies as a list of lists (a flat list is one packing), ``options`` as a list of tables.

Every case is validated as a case id is (:class:`Case` itself, then the op descriptor's ``validate``);
an error is one line naming the file, the entry (``case[2]``, ``grid[0]`` with the combination) and the
field, and a case given twice is an error naming both entries.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path
from typing import Any, Callable

from .case import DTYPES, Case, Gate

ENTRY_KINDS = ("case", "grid")
FIELDS = tuple(f.name for f in dataclasses.fields(Case))
REQUIRED = ("op", "variant", "B", "T", "H", "K", "V")
GATE_FIELDS = tuple(f.name for f in dataclasses.fields(Gate))


class CaseFileError(ValueError):
    """A case file that cannot be read or holds a bad entry: one line naming the file, entry and field."""


class _EntryError(ValueError):
    """What is wrong with one entry: the field (None when no one field is to blame) and, in a grid, the
    combination of list values that made the bad case."""

    def __init__(self, field: str | None, message: str, combo: str = ""):
        super().__init__(" ".join(str(message).split()))
        self.field, self.combo = field, combo


# ------------------------------------------------------------- field values
def _positive_int(v):
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"must be a positive int, got {v!r}")
    return v


def _non_negative_int(v):
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"must be a non-negative int, got {v!r}")
    return v


def _name(v):
    if not isinstance(v, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
        raise ValueError(f"must be a name (letters, digits, _), got {v!r}")
    return v


def _bool(v):
    if not isinstance(v, bool):
        raise ValueError(f"must be true or false, got {v!r}")
    return v


def _number(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"must be a number, got {v!r}")
    return float(v)


def _dtype(v):
    labels = {label: name for name, label in DTYPES.items()}
    if v in DTYPES:
        return v
    if v in labels:
        return labels[v]
    raise ValueError(f"must be one of {tuple(DTYPES)} (or {tuple(labels)}), got {v!r}")


def _gate(v):
    if v is False:
        return None  # a gate-less op
    if isinstance(v, str):
        return Gate.from_label(v)
    if isinstance(v, dict):
        unknown = sorted(set(v) - set(GATE_FIELDS))
        if unknown:
            raise ValueError(f"unknown gate field(s) {unknown}; known: {list(GATE_FIELDS)}")
        return Gate(**v)
    raise ValueError(f"must be a gate label (e.g. 'g=logsigmoid/16'), a table of {list(GATE_FIELDS)}, or false "
                     f"for a gate-less op, got {v!r}")


def _gamma(v):
    if v is False:
        return None  # one gate
    if isinstance(v, (str, dict)):
        return _gate(v)
    raise ValueError(f"must be the g_gamma gate of a case with both gates: a gate label (e.g. "
                     f"'g_gamma=halfnormal/2'), a table of {list(GATE_FIELDS)}, or false for none, got {v!r}")


def _options(v):
    if not isinstance(v, dict):
        raise ValueError(f"must be a table of the op's options (name = value), got {v!r}")
    for name, value in v.items():
        if isinstance(value, (dict, list)):
            raise ValueError(f"option {name} = {value!r} must be a bool, number or string")
    return tuple(v.items())


def _lens(v):
    if (not isinstance(v, list) or not v or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in v)
            or not any(v)):
        raise ValueError(f"must be a non-empty list of non-negative ints, not all 0 (packed sequence lengths), "
                         f"got {v!r}")
    return tuple(v)


CHECKS: dict[str, Callable[[Any], Any]] = {
    "op": _name, "variant": _name, "B": _positive_int, "T": _positive_int, "H": _positive_int,
    "HV": _positive_int, "K": _positive_int, "V": _positive_int, "dtype": _dtype, "gate": _gate,
    "chunk_size": _positive_int,
    "h0": _bool, "final_state": _bool, "dht": _bool, "state_v_first": _bool, "scale": _number,
    "seed": _non_negative_int,
    "options": _options, "lens": _lens, "gamma": _gamma,
}
assert set(CHECKS) == set(FIELDS), "a Case field without a case-file check"


def _varies(name: str, value) -> bool:
    """Whether a grid field's value is a list of the values it takes (lens: a list of lists)."""
    if not isinstance(value, list):
        return False
    return name != "lens" or all(isinstance(x, list) for x in value)


# ------------------------------------------------------------------- cases
def _blame(message: str, fields: dict) -> str | None:
    """The entry's field a cross-field error names (``lens=... T must equal it``), for the error line: the
    option named first in the message (a message may go on to list the known options), then the longer field
    names (a shape letter last: messages quote shapes)."""
    def where(name):
        found = re.search(rf"(?<![\w.]){re.escape(name.split('.')[-1])}(?!\w)", message)
        return found.start() if found else None

    options = [(where(f"options.{k}"), f"options.{k}") for k, _ in fields.get("options", ())]
    options = sorted((at, name) for at, name in options if at is not None)
    if options:
        return options[0][1]
    names = sorted((n for n in fields if n != "options"), key=lambda n: (len(n) == 1, -len(n)))
    names += ["options"] if "options" in fields else []
    for name in names:
        if where(name) is not None:
            return name
    return None


def _make_case(fields: dict, ops: Callable[[str], Any]) -> Case:
    """A case from checked field values, validated by its op (``ops``: name -> descriptor); _EntryError naming
    what is wrong."""
    missing = [n for n in REQUIRED if n not in fields]
    if missing:
        raise _EntryError(missing[0], f"missing (required: {', '.join(REQUIRED)}; with lens, T and B may be "
                                      f"left out)")
    try:
        op = ops(fields["op"])
    except ValueError as exc:
        raise _EntryError("op", str(exc)) from None
    if fields["variant"] not in op.variants:
        raise _EntryError("variant", f"{op.name} has variants {op.variants}, got {fields['variant']!r}")
    try:
        case = Case(**fields)
        op.validate(case)
    except ValueError as exc:
        message = " ".join(str(exc).split())
        raise _EntryError(_blame(message, fields), message) from None
    return case


def _entry_fields(entry: dict, kind: str) -> dict:
    """The entry's fields checked one by one (a grid's lists value by value), lens filling in B and T."""
    unknown = [k for k in entry if k not in FIELDS]
    if unknown:
        raise _EntryError(unknown[0], f"unknown field; fields: {', '.join(FIELDS)}"
                                      + (", or id alone" if kind == "case" else ""))
    out = {}
    for name, value in entry.items():
        values = value if kind == "grid" and _varies(name, value) else None
        try:
            if values is not None:
                if not values:
                    raise ValueError("an empty list expands to no case")
                out[name] = [CHECKS[name](v) for v in values]
            else:
                out[name] = CHECKS[name](value)
        except ValueError as exc:
            raise _EntryError(name, str(exc)) from None
    return out


def _expand(fields: dict, kind: str) -> list[tuple[str, dict]]:
    """(combination label, fields) per case: one for a case, the cartesian product of the lists for a grid."""
    varying = [n for n, v in fields.items() if kind == "grid" and isinstance(v, list)]
    combos = itertools.product(*(fields[n] for n in varying))
    out = []
    for combo in combos:
        one = {**fields, **dict(zip(varying, combo))}
        if "lens" in one:
            one.setdefault("T", sum(one["lens"]))
            one.setdefault("B", 1)
        label = ", ".join(f"{n}={_show(n, v)}" for n, v in zip(varying, combo))
        out.append((label, one))
    return out


def _show(name: str, value) -> str:
    if name in ("gate", "gamma"):
        return value.label if value is not None else "none"
    if name == "options":
        return "{" + ",".join(f"{k}={v}" for k, v in value) + "}"
    if name == "lens":
        return "+".join(map(str, value))
    return str(value)


def _entry_cases(entry, kind: str, ops: Callable[[str], Any]) -> list[tuple[str, Case]]:
    """(combination label, case) for one entry; _EntryError naming the bad part."""
    if not isinstance(entry, dict):
        raise _EntryError(None, f"must be a table ([[{kind}]]), got {entry!r}")
    if kind == "case" and "id" in entry:
        if len(entry) > 1:
            raise _EntryError("id", f"an id names the whole case: give the id alone or the fields, not both "
                                    f"(also given: {', '.join(k for k in entry if k != 'id')})")
        if not isinstance(entry["id"], str):
            raise _EntryError("id", f"must be a case id string, got {entry['id']!r}")
        try:
            return [("", Case.from_id(entry["id"], ops=ops))]
        except ValueError as exc:
            raise _EntryError("id", str(exc)) from None
    out = []
    for label, fields in _expand(_entry_fields(entry, kind), kind):
        try:
            out.append((label, _make_case(fields, ops)))
        except _EntryError as exc:
            exc.combo = label
            raise
    return out


def _file_order(text: str, data: dict) -> list[tuple[str, int]]:
    """(kind, index) of every entry in the order the file writes them. tomllib keeps each kind's entries in
    order but not how the kinds interleave, so the ``[[case]]``/``[[grid]]`` headers are read from the text;
    a file written otherwise (an inline array of tables) is taken kind by kind."""
    headers = re.findall(r"(?m)^[ \t]*\[\[[ \t]*(case|grid)[ \t]*\]\]", text)
    if all(headers.count(kind) == len(data[kind]) for kind in data) and len(headers) == sum(map(len, data.values())):
        seen: dict[str, int] = {}
        order = []
        for kind in headers:
            order.append((kind, seen.get(kind, 0)))
            seen[kind] = seen.get(kind, 0) + 1
        return order
    return [(kind, i) for kind in data for i in range(len(data[kind]))]


def load_cases(path, ops: Callable[[str], Any]) -> list[Case]:
    """The cases of a case file, in file order (the ``[[case]]`` and ``[[grid]]`` headers as the file
    interleaves them, each grid expanded in place); :class:`CaseFileError` with one line on anything wrong.
    ``ops`` is the op registry's lookup (name -> descriptor, ``harness.ops.get_op``): each case is checked
    against its op's variants and ``validate``, and this layer imports no op (``harness.app.load_cases``)."""
    import tomllib

    path = Path(path)
    try:
        text = path.read_text()
        data = tomllib.loads(text)
    except OSError as exc:
        raise CaseFileError(f"cases file {path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise CaseFileError(f"cases file {path}: not UTF-8 text ({exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        raise CaseFileError(f"cases file {path}: not valid TOML ({' '.join(str(exc).split())})") from None
    unknown = [k for k in data if k not in ENTRY_KINDS]
    if unknown:
        raise CaseFileError(f"cases file {path}: unknown table or key {unknown[0]!r}; entries are [[case]] "
                            f"(one case) and [[grid]] (every combination of list-valued fields)")
    cases: list[Case] = []
    where: dict[str, str] = {}
    for kind in data:
        if not isinstance(data[kind], list):
            raise CaseFileError(f"cases file {path}: {kind!r} must be an array of tables: write [[{kind}]], "
                                f"not [{kind}]")
    for kind, i in _file_order(text, data):
        entry, name = data[kind][i], f"{kind}[{i}]"
        try:
            made = _entry_cases(entry, kind, ops)
        except _EntryError as exc:
            entry_name = f"{name} ({exc.combo})" if exc.combo else name
            field = f" field {exc.field!r}:" if exc.field else ""
            raise CaseFileError(f"cases file {path}: {entry_name}:{field} {exc}") from None
        for label, case in made:
            here = f"{name} ({label})" if label else name
            if case.id in where:
                raise CaseFileError(f"cases file {path}: {here} repeats case {case.id} of {where[case.id]}")
            where[case.id] = here
            cases.append(case)
    if not cases:
        raise CaseFileError(f"cases file {path}: no [[case]] or [[grid]] entry")
    return cases
