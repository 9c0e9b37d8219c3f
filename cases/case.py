"""The case: one fully specified sample of an op, with a stable, readable id.

A case is plain data. Everything a leg needs is derived from it: the input
arrays (see ``cases.inputs``), the tensors to compare (see the op descriptor in
``harness.ops``) and the seed of the input generator (a sha256 of the id).

Shape letters follow flash-linear-attention: ``B`` batch, ``T`` tokens, ``H``
heads, ``K`` key dim, ``V`` value dim, ``C`` chunk size (``BT`` in fla), ``N``
the number of independent sequences: B, or with packed variable-length
sequences (``lens``, fla's ``cu_seqlens``) the number of sequences packed into
the one batch row.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Any, Callable

DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
"""Case dtypes and their short labels used in case ids."""

GATE_KINDS = ("g", "g_gamma")
"""``g``: a per-token log decay tensor (its shape is the op's: [B,T,H] or
[B,T,H,K]); ``g_gamma``: a constant log decay, one per head [H] unless its ``gamma_shape`` says otherwise."""

GATE_LAWS = ("logsigmoid", "alibi", "const", "halfnormal")

KIND_LAWS = {"g": ("logsigmoid", "alibi"), "g_gamma": ("alibi", "const", "halfnormal", "logsigmoid")}
"""The laws each gate kind is drawn by: a per-token ``g`` from log-sigmoids (or ALiBi slopes broadcast over its
tokens), a constant ``g_gamma`` from ALiBi slopes, one given value, half-normal or log-sigmoid draws (one per
value of its shape: fla's and tops' tests draw ``logsigmoid(randn(H))``)."""

GAMMA_SHAPES = {"": "one value for every head (a scalar, shape [])", "H": "one value per head ([H])",
                "H,K": "one value per head and key channel ([H,K])"}
"""A ``g_gamma`` gate's shapes (:attr:`Gate.gamma_shape`), written between brackets after the kind in a label
(``g_gamma[]=``, ``g_gamma[H,K]=``); per head, the default, is written with none (``g_gamma=``)."""

ID_FLAGS = ("lens", "h0", "dht", "noht", "state_v_first", "scale", "seed")
"""Names the id's last part uses for the case's own flags; an option may not take one."""


@dataclass(frozen=True)
class Gate:
    """How the log-decay gate is drawn.

    - ``kind="g", law="logsigmoid"``: ``logsigmoid(N(0,1)) / normalizer``,
      the gate fla's tests use (normalizer 16 keeps decays realistic).
    - ``kind="g_gamma", law="alibi"``: per head,
      ``-slope_h * (1 - layer_idx / max(num_layers - 1, 1) + 1e-5)`` with ALiBi
      slopes ``slope_h = 2**(-8 (h+1) / H)`` (for H a power of two). Layer 0 is
      the steepest decay; the steepest slope is 2**-0.5 only when H >= 16.
    - ``kind="g_gamma", law="const"``: every element is ``value`` (<= 0), e.g. tops' tests'
      ``g_gamma = full((H,), -0.5)``. Label ``const(<value>)``.
    - ``kind="g_gamma", law="halfnormal"``: ``-|N(0,1)| / normalizer`` per element, e.g. tops' tests'
      ``-abs(normal((H,))) * 0.5`` is ``halfnormal/2``; ``law="logsigmoid"``: ``logsigmoid(N(0,1)) /
      normalizer`` per element (``logsigmoid(randn(H))`` is ``g_gamma=logsigmoid/1``).
    - ``gamma_shape`` (a ``g_gamma`` only): ``"H"`` one value per head (the default), ``""`` one value for every
      head (a scalar), ``"H,K"`` one per head and key channel (gla's per-channel decay, constant over tokens).
      ALiBi slopes are per head: an ``"H,K"`` ALiBi gate repeats each head's over K, and a scalar has none.
    - ``lower_bound``: optional clamp of a ``g`` gate from below (safe-gate
      style), recorded in the id.
    - ``mask_p``: fla's tests' gate masking (``g * (rand > mask_p)``): each log decay
      of a ``g`` gate is zeroed (no decay at that token) with probability ``mask_p``,
      drawn with the gate. Recorded in the id as ``,mask<p>``.
    """

    kind: str = "g"
    law: str = "logsigmoid"
    normalizer: float = 16.0
    num_layers: int = 32
    layer_idx: int = 0
    lower_bound: float | None = None
    mask_p: float = 0.0
    value: float | None = None  # law="const": the one log decay
    gamma_shape: str = "H"  # a g_gamma's shape: "H" per head, "" one for all heads, "H,K" per head and channel

    def __post_init__(self):
        if self.kind not in GATE_KINDS:
            raise ValueError(f"{self.kind=} must be one of {GATE_KINDS}")
        if self.law not in GATE_LAWS:
            raise ValueError(f"{self.law=} must be one of {GATE_LAWS}")
        if self.law not in KIND_LAWS[self.kind]:
            what = ("a per-token g gate is drawn by" if self.kind == "g" else
                    "a g_gamma gate is a constant, drawn by")
            raise ValueError(f"{what} one of {KIND_LAWS[self.kind]}, not law={self.law!r}")
        if self.law == "alibi" and not 0 <= self.layer_idx < max(self.num_layers, 1):
            raise ValueError(f"{self.layer_idx=} must lie in [0, {self.num_layers=})")
        if self.law in ("logsigmoid", "halfnormal") and not (_real(self.normalizer) and self.normalizer > 0):
            raise ValueError(f"normalizer={self.normalizer!r} divides the {self.law} draws: pass a positive number")
        if self.law == "const":
            if not (_real(self.value) and math.isfinite(self.value) and self.value <= 0):
                raise ValueError(f"value={self.value!r}: law='const' needs the log decay it repeats, a finite "
                                 f"number <= 0, e.g. value=-0.5")
        elif self.value is not None:
            raise ValueError(f"value={self.value!r} is law='const''s; law={self.law!r} draws its values")
        if self.gamma_shape not in GAMMA_SHAPES:
            raise ValueError(f"gamma_shape={self.gamma_shape!r} must be one of {tuple(GAMMA_SHAPES)}: "
                             + "; ".join(f"{k!r} {v}" for k, v in GAMMA_SHAPES.items()))
        if self.kind == "g" and self.gamma_shape != "H":
            raise ValueError("gamma_shape is a g_gamma's; a g gate has its op's per-token shape: drop gamma_shape")
        if self.law == "alibi" and self.gamma_shape == "":
            raise ValueError("ALiBi slopes are per head: a scalar g_gamma[] takes const(<value>) or "
                             "halfnormal/<normalizer>")
        if isinstance(self.mask_p, bool) or not isinstance(self.mask_p, numbers.Real) or not 0 <= self.mask_p < 1:
            raise ValueError(f"mask_p={self.mask_p!r} must be a probability in [0, 1)")
        if self.mask_p and self.kind != "g":
            raise ValueError("mask_p masks a per-token g gate; a g_gamma gate has no tokens to mask")

    @property
    def label(self) -> str:
        if self.law == "alibi":
            body = f"alibi(L{self.num_layers},l{self.layer_idx})"
        elif self.law == "const":
            body = f"const({_num(self.value)})"
        else:
            body = f"{self.law}/{_num(self.normalizer)}"
        if self.lower_bound is not None:
            body += f",lb{_num(self.lower_bound)}"
        if self.mask_p:
            body += f",mask{_num(self.mask_p)}"
        shape = "" if self.gamma_shape == "H" else f"[{self.gamma_shape}]"
        return f"{self.kind}{shape}={body}"

    @classmethod
    def from_label(cls, label: str) -> "Gate":
        """The gate a :attr:`label` names (``g=logsigmoid/16,lb-5``, ``g_gamma=alibi(L32,l0)``,
        ``g_gamma[H,K]=halfnormal/10``): its inverse for the fields the label shows. ValueError, one line, on
        anything else."""
        parts = label.split("/") if isinstance(label, str) else [""]
        if not _is_gate(parts[0]):
            raise ValueError(f"gate {label!r} must read <kind>[<shape>]=<law>, the kind one of {GATE_KINDS}, e.g. "
                             f"g=logsigmoid/16, g_gamma=alibi(L32,l0) or g_gamma[]=const(-0.5)")
        gate = _parse_gate(parts.pop(0), parts)
        if parts and _is_gate(parts[0]):
            raise ValueError(f"gate {label!r} holds two gates: a case with both gives its g_gamma one as the case's "
                             f"gamma (case-file field gamma = {'/'.join(parts)!r})")
        if parts:
            raise ValueError(f"gate {label!r}: {'/'.join(parts)!r} follows the gate's label")
        return gate


def _real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _num(x: float) -> str:
    """Shortest stable text for a number in an id: 16 not 16.0, 0.5 as 0.5."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


@dataclass(frozen=True)
class Case:
    """One sample: op, variant, shapes, dtype, gate, chunking, state and upstream grads.

    Fields map one-to-one onto the case id, so two cases with equal ids are equal
    and draw bit-identical inputs on every machine.
    """

    op: str  # op name in the registry: "simple_gla", "gla", "kda"
    variant: str  # kernel variant: "chunk", "fused_chunk", ...
    B: int
    T: int
    H: int
    K: int
    V: int
    dtype: str = "bfloat16"  # dtype of q, k, v, do and of the kernel's o, dq, dk, dv
    gate: Gate | None = field(default_factory=Gate)  # None for a gate-less op (e.g. fla's delta_rule)
    chunk_size: int = 64  # C: tokens per chunk
    h0: bool = False  # pass an initial state [B,H,K,V] (and compare dh0)
    final_state: bool = True  # output_final_state: return ht [B,H,K,V]
    dht: bool = False  # feed a non-zero upstream gradient for ht
    scale: float | None = None  # None means K ** -0.5, as in fla
    seed: int = 0  # extra seed, mixed into the id hash
    options: tuple[tuple[str, Any], ...] = ()  # op-specific options, sorted (name, value) pairs
    lens: tuple[int, ...] | None = None  # packed sequence lengths (B=1, T=sum): fla's cu_seqlens; None: not packed
    HV: int | None = None  # value heads (fla's GVA: v, the gate, beta and the state have HV; q, k have H); None: H
    state_v_first: bool = False  # fla's state_v_first: h0, ht, dht and dh0 are [N,HV,V,K] (the state transposed)
    gamma: Gate | None = None  # both gates at once: a g_gamma gate beside the g gate (their log decays add)

    def __post_init__(self):
        if self.gate is not None and not isinstance(self.gate, Gate):
            raise ValueError(f"gate={self.gate!r} must be a Gate or None (a gate-less op)")
        if self.gamma is not None:
            if not isinstance(self.gamma, Gate) or self.gamma.kind != "g_gamma":
                got = self.gamma.label if isinstance(self.gamma, Gate) else repr(self.gamma)
                raise ValueError(f"gamma={got} must be the g_gamma gate of a case with both gates, a "
                                 f"Gate(kind='g_gamma', ...) (in an id the g gate comes first: "
                                 f"g=logsigmoid/16/g_gamma=halfnormal/2), or None")
            if self.gate is None or self.gate.kind != "g":
                raise ValueError(f"gamma={self.gamma.label} goes beside a per-token g gate (both gates at once), "
                                 f"got gate={self.gate.label if self.gate else None}: pass gate=Gate(kind='g', ...) "
                                 f"or drop gamma")
        if self.dtype not in DTYPES:
            raise ValueError(f"{self.dtype=} must be one of {tuple(DTYPES)}")
        if self.HV is None:
            object.__setattr__(self, "HV", self.H)  # no grouped value heads: Case(H=2) == Case(H=2, HV=2)
        for name in ("B", "T", "H", "HV", "K", "V", "chunk_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name}={value!r} must be a positive int")
        if self.HV % self.H:
            raise ValueError(f"HV={self.HV} value heads must be a multiple of H={self.H} query/key heads "
                             f"(fla's grouped value attention)")
        if self.dht and not self.final_state:
            raise ValueError("dht=True needs final_state=True: dht is the gradient of ht")
        if self.state_v_first and not (self.h0 or self.final_state):
            raise ValueError("state_v_first=True lays out the state, and this case has none (no h0, noht): drop it")
        object.__setattr__(self, "options", tuple(sorted(dict(self.options).items())))
        clash = sorted(set(self.opt) & set(ID_FLAGS))
        if clash:  # an option printed as name=value could read as one of the id's own flags
            raise ValueError(f"options {clash} are names the case id uses for its own flags {ID_FLAGS}; rename them")
        if self.lens is not None:
            self._check_lens()

    def _check_lens(self):
        lens = tuple(self.lens) if isinstance(self.lens, (list, tuple)) else ()
        if (not lens or any(not isinstance(n, numbers.Integral) or isinstance(n, bool) or n < 0 for n in lens)
                or not any(lens)):
            raise ValueError(f"lens={self.lens!r} must be a non-empty tuple of non-negative ints, not all 0 (packed "
                             f"sequence lengths; an empty sequence, as in fla's tests' cu_seqlens [0, 0, 16], "
                             f"passes its state through)")
        lens = tuple(int(n) for n in lens)  # numpy ints print and hash as Python ints in the id
        if self.B != 1:
            raise ValueError(f"lens={lens} packs sequences along T of one batch row: B must be 1, got B={self.B}")
        if self.T != sum(lens):
            raise ValueError(f"lens={lens} packs sum(lens)={sum(lens)} tokens: T must equal it, got T={self.T}")
        object.__setattr__(self, "lens", lens)

    # ----------------------------------------------------------------- derived
    @property
    def resolved_scale(self) -> float:
        return self.K ** -0.5 if self.scale is None else float(self.scale)

    @property
    def opt(self) -> dict[str, Any]:
        return dict(self.options)

    @property
    def gates(self) -> tuple[Gate, ...]:
        """The case's gates in input order: none (a gate-less op), its one gate, or g then g_gamma (both at once)."""
        return tuple(g for g in (self.gate, self.gamma) if g is not None)

    @property
    def id(self) -> str:
        """Stable, readable id, e.g.
        ``simple_gla.chunk/B1-T256-H2-K128-V128/bf16/g_gamma=alibi(L32,l0)/C128/h0``; packed sequences
        lead the flags: ``.../C64/lens=37+64+27,h0,dht`` (T = 128 = 37 + 64 + 27, in packing order)."""
        parts = [
            f"{self.op}.{self.variant}",
            f"B{self.B}-T{self.T}-H{self.H}{self._hv_part}-K{self.K}-V{self.V}",
            DTYPES[self.dtype],
            *(gate.label for gate in self.gates),
            f"C{self.chunk_size}",
        ]
        flags = [f"lens={'+'.join(map(str, self.lens))}"] if self.lens is not None else []
        flags += [name for name, on in (("h0", self.h0), ("dht", self.dht)) if on]
        if not self.final_state:
            flags.append("noht")
        if self.state_v_first:
            flags.append("state_v_first")
        if self.scale is not None:
            flags.append(f"scale={_num(self.scale)}")
        if self.seed:
            flags.append(f"seed={self.seed}")
        flags += [f"{k}={_opt(v)}" for k, v in self.options]
        if flags:
            parts.append(",".join(flags))
        return "/".join(parts)

    @property
    def _hv_part(self) -> str:
        """``-HV<n>`` in the shape part when value heads are grouped (HV > H); nothing otherwise, so every
        case without GVA keeps its id (and its inputs)."""
        return f"-HV{self.HV}" if self.HV != self.H else ""

    @property
    def grouped_values(self) -> bool:
        """Grouped value heads (GVA): HV > H, each q/k head serving HV // H value heads."""
        return self.HV != self.H

    @property
    def rng_seed(self) -> int:
        """Seed of the input generator: the first 8 bytes of sha256(id), never ``hash()``."""
        return int.from_bytes(hashlib.sha256(self.id.encode()).digest()[:8], "little")

    @property
    def num_seqs(self) -> int:
        """N, the number of independent sequences: len(lens) when packed, else B."""
        return self.B if self.lens is None else len(self.lens)

    @property
    def cu_seqlens(self) -> tuple[int, ...] | None:
        """fla's ``cu_seqlens``: the N+1 offsets (0, l0, l0+l1, ..., T) of the packed sequences; None when
        not packed (fla's default)."""
        return None if self.lens is None else (0, *itertools.accumulate(self.lens))

    @property
    def state_shape(self) -> tuple[int, int, int, int]:
        """[N,HV,K,V]: the shape of h0, ht, dht and dh0, one state per sequence and value head; [N,HV,V,K] with
        ``state_v_first`` (fla's V-first layout: the same state, transposed)."""
        if self.state_v_first:
            return (self.num_seqs, self.HV, self.V, self.K)
        return (self.num_seqs, self.HV, self.K, self.V)

    @property
    def num_chunks(self) -> int:
        """Chunks of C tokens per batch row; chunks never span a packed sequence boundary (as in fla)."""
        if self.lens is not None:
            return sum(math.ceil(n / self.chunk_size) for n in self.lens)
        return math.ceil(self.T / self.chunk_size)

    @classmethod
    def from_id(cls, text: str, *, ops: "Callable[[str], Any] | None" = None) -> "Case":
        """The case a case id names: the inverse of :attr:`id` (``Case.from_id(c.id) == c``).

        ``op.variant/B..-T..-H..[-HV..]-K..-V../dtype[/gate[/g_gamma gate]]/C..[/flags]``: the dtype as its label
        (``bf16``) or its name (``bfloat16``); the gate as :attr:`Gate.label` writes it (``g=logsigmoid/16,lb-5``,
        ``g_gamma=alibi(L32,l0)``, ``g_gamma[]=const(-0.5)``), absent for a gate-less op, and with both gates the
        g gate then the g_gamma one (``g=logsigmoid/16/g_gamma=halfnormal/2``: :attr:`gamma`); flags in any order,
        each at most once: ``lens=a+b``, ``h0``, ``dht``, ``noht``, ``state_v_first``, ``scale=x``, ``seed=n`` and
        the op's options ``name=value``. An
        option's value reads as the id writes it: ``1``/``0`` (or ``true``/``false``) a bool, ``-5`` an int (equal
        to -5.0), ``0.5`` a float, anything else a string (a case file, :mod:`cases.case_file`, gives exact types).

        A malformed id raises ValueError with one line naming the bad part. Given ``ops`` (an op registry's
        lookup, name -> descriptor: ``harness.ops.get_op``), so does a well-formed id of a case its op cannot
        run: the descriptor's own ``validate``, the contract every leg shares. The case layer imports no op:
        the layer above passes its registry in (``harness.app.case_from_id``).
        """
        case = _parse_id(text)
        if ops is not None:
            try:
                ops(case.op).validate(case)
            except ValueError as exc:
                raise ValueError(f"case id {text.strip()!r}: {_one_line(exc)}") from None
        return case

    def replace(self, **changes) -> "Case":
        if "H" in changes and "HV" not in changes and not self.grouped_values:
            changes["HV"] = None  # no grouped value heads before: none after (HV follows the new H)
        return dataclasses.replace(self, **changes)

    def __str__(self) -> str:  # pytest ids and log lines
        return self.id


def _opt(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return _num(v)
    return str(v)



# ---------------------------------------------------------------- id parser
_NUMBER = r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_INT = re.compile(r"-?\d+")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SHAPE = re.compile(r"B(\d+)-T(\d+)-H(\d+)(?:-HV(\d+))?-K(\d+)-V(\d+)")
_ALIBI = re.compile(r"alibi\(L(\d+),l(\d+)\)")
_CONST = re.compile(rf"const\(({_NUMBER})\)")
_KIND = re.compile(r"(g|g_gamma)(?:\[([^\]]*)\])?=")
_GATE_TAIL = re.compile(rf"(?:,lb({_NUMBER}))?(?:,mask({_NUMBER}))?")
_LABELS = {label: name for name, label in DTYPES.items()}
_BARE_FLAGS = {"h0": ("h0", True), "dht": ("dht", True), "noht": ("final_state", False),
               "state_v_first": ("state_v_first", True)}
ID_FORMAT = "op.variant/B<n>-T<n>-H<n>[-HV<n>]-K<n>-V<n>/<dtype>[/<gate>[/<g_gamma gate>]]/C<n>[/<flag>,...]"


def _is_gate(part: str) -> bool:
    """Whether an id part opens a gate label: ``g=``, ``g_gamma=`` or ``g_gamma[<shape>]=``."""
    return bool(_KIND.match(part))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _number(text: str, what: str) -> float:
    if not re.fullmatch(_NUMBER, text) or not math.isfinite(float(text)):
        raise ValueError(f"{what} {text!r} is not a finite number")
    return float(text)


def _option_value(text: str) -> Any:
    """An option value as :func:`_opt` writes it: 1/0 a bool, an integer an int, a number a float, else text."""
    if text in ("1", "true"):
        return True
    if text in ("0", "false"):
        return False
    if _INT.fullmatch(text):
        return int(text)
    if re.fullmatch(_NUMBER, text):
        return _number(text, "value")
    return text


def _parse_gate(kind_body: str, parts: list[str]) -> Gate:
    """A gate label: ``kind[<shape>]=alibi(L<n>,l<n>)`` or ``=const(<x>)`` or ``=<law>/<normalizer>``, where the
    normalizer is the next part of the id (``parts``, consumed); then ``[,lb<x>][,mask<p>]``."""
    head = _KIND.match(kind_body)
    kind, shape, body = head.group(1), head.group(2), kind_body[head.end():]
    shape_field = {} if shape is None else {"gamma_shape": shape}
    lower_bound, rest = None, body
    alibi, const = _ALIBI.match(body), _CONST.match(body)
    if alibi:
        rest = body[alibi.end():]
        fields = dict(law="alibi", num_layers=int(alibi.group(1)), layer_idx=int(alibi.group(2)))
        bad = kind_body
    elif const:
        rest = body[const.end():]
        fields = dict(law="const", value=_number(const.group(1), f"gate {kind_body!r}: const value"))
        bad = kind_body
    elif body in GATE_LAWS:
        if body in ("alibi", "const"):
            raise ValueError(f"gate {kind_body!r}: an {body} gate reads "
                             + ("alibi(L<layers>,l<layer>)" if body == "alibi" else "const(<log decay>)"))
        if not parts:
            raise ValueError(f"gate {kind_body!r} lacks its normalizer part, e.g. {kind_body}/16")
        text = parts.pop(0)
        norm, _, rest = text.partition(",")
        if re.fullmatch(r"C\d+", norm):
            raise ValueError(f"gate {kind_body!r} lacks its normalizer part before {text!r}, e.g. {kind_body}/16")
        rest = "," + rest if rest else ""
        fields = dict(law=body, normalizer=_number(norm, f"gate {kind_body}/{text}: normalizer"))
        bad = f"{kind_body}/{text}"
    else:
        raise ValueError(f"gate {kind_body!r}: law must be one of {GATE_LAWS} (logsigmoid/<normalizer>, "
                         f"alibi(L<layers>,l<layer>), const(<log decay>) or halfnormal/<normalizer>)")
    mask_p = 0.0
    if rest:
        tail = _GATE_TAIL.fullmatch(rest)
        if not tail:
            raise ValueError(f"gate {bad!r}: after the law only ',lb<number>' (a lower bound) and then "
                             f"',mask<p>' (a masking probability) may follow, got {rest!r}")
        if tail.group(1) is not None:
            lower_bound = _number(tail.group(1), f"gate {bad!r}: lower bound")
        if tail.group(2) is not None:
            mask_p = _number(tail.group(2), f"gate {bad!r}: mask probability")
    try:
        return Gate(kind=kind, lower_bound=lower_bound, mask_p=mask_p, **fields, **shape_field)
    except ValueError as exc:
        raise ValueError(f"gate {bad!r}: {_one_line(exc)}") from None


def _parse_flags(text: str) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    options: dict[str, Any] = {}
    seen: set[str] = set()
    for flag in text.split(","):
        name, eq, value = flag.partition("=")
        if not _NAME.fullmatch(name) or (eq and not value):
            raise ValueError(f"flag {flag!r} in {text!r}: a flag is h0, dht, noht, state_v_first or name=value")
        if name in seen:
            raise ValueError(f"flag {name!r} appears twice in {text!r}")
        seen.add(name)
        if not eq:
            if name not in _BARE_FLAGS:
                raise ValueError(f"flag {flag!r} in {text!r}: a bare flag is one of {tuple(_BARE_FLAGS)}; "
                                 f"an option reads name=value")
            field_name, on = _BARE_FLAGS[name]
            fields[field_name] = on
        elif name in _BARE_FLAGS:
            raise ValueError(f"flag {flag!r}: {name} takes no value")
        elif name == "lens":
            if not re.fullmatch(r"\d+(?:\+\d+)*", value):
                raise ValueError(f"flag {flag!r}: lens reads <n>+<n>+... (packed sequence lengths)")
            fields["lens"] = tuple(int(n) for n in value.split("+"))
        elif name == "scale":
            fields["scale"] = _number(value, f"flag {flag!r}:")
        elif name == "seed":
            if not re.fullmatch(r"\d+", value):
                raise ValueError(f"flag {flag!r}: seed must be a non-negative int")
            fields["seed"] = int(value)
        else:
            options[name] = _option_value(value)
    if options:
        fields["options"] = tuple(options.items())
    return fields


def _parse_id(text: str) -> Case:
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"case id {text!r} is empty; a case id reads {ID_FORMAT}")
    text = text.strip()
    try:
        return _parse_parts(text.split("/"))
    except ValueError as exc:
        raise ValueError(f"case id {text!r}: {_one_line(exc)}") from None


def _parse_parts(parts: list[str]) -> Case:
    if len(parts) < 4:
        raise ValueError(f"has {len(parts)} parts; a case id reads {ID_FORMAT}")
    head = parts.pop(0)
    op, dot, variant = head.partition(".")
    if not (dot and _NAME.fullmatch(op) and _NAME.fullmatch(variant)):
        raise ValueError(f"part {head!r} must read op.variant, e.g. simple_gla.chunk")
    shape = parts.pop(0)
    match = _SHAPE.fullmatch(shape)
    if not match:
        raise ValueError(f"part {shape!r} must read B<n>-T<n>-H<n>[-HV<n>]-K<n>-V<n>, e.g. B1-T128-H2-K128-V128 "
                         f"(or B1-T128-H2-HV4-K128-V128 with grouped value heads)")
    dims = {name: int(n) for name, n in zip(("B", "T", "H", "HV", "K", "V"), match.groups()) if n is not None}
    label = parts.pop(0)
    dtype = _LABELS.get(label, label if label in DTYPES else None)
    if dtype is None:
        raise ValueError(f"part {label!r} is not a dtype: one of {tuple(_LABELS)}")
    gate = gamma = None
    if parts and _is_gate(parts[0]):
        gate = _parse_gate(parts.pop(0), parts)
    if parts and _is_gate(parts[0]):
        gamma = _parse_gate(parts.pop(0), parts)  # both gates: Case checks it is g then g_gamma
    if not parts:
        raise ValueError("lacks the chunk size part C<n>")
    chunk = parts.pop(0)
    if not re.fullmatch(r"C\d+", chunk):
        what = "a gate (g=... or g_gamma=...) or " if gate is None else ""
        raise ValueError(f"part {chunk!r} is not {what}a chunk size C<n>")
    fields = _parse_flags(parts.pop(0)) if parts else {}
    if parts:
        raise ValueError(f"part {'/'.join(parts)!r} follows the flags; a case id ends with its flags")
    try:
        return Case(op=op, variant=variant, dtype=dtype, gate=gate, gamma=gamma, chunk_size=int(chunk[1:]), **dims,
                    **fields)
    except ValueError as exc:
        raise ValueError(_one_line(exc)) from None
