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
from dataclasses import dataclass, field
from typing import Any

DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
"""Case dtypes and their short labels used in case ids."""

GATE_KINDS = ("g", "g_gamma")
"""``g``: a per-token log decay tensor (its shape is the op's: [B,T,H] or
[B,T,H,K]); ``g_gamma``: a per-head constant log decay [H]."""

GATE_LAWS = ("logsigmoid", "alibi")

ID_FLAGS = ("lens", "h0", "dht", "noht", "scale", "seed")
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
    - ``lower_bound``: optional clamp of a ``g`` gate from below (safe-gate
      style), recorded in the id.
    """

    kind: str = "g"
    law: str = "logsigmoid"
    normalizer: float = 16.0
    num_layers: int = 32
    layer_idx: int = 0
    lower_bound: float | None = None

    def __post_init__(self):
        if self.kind not in GATE_KINDS:
            raise ValueError(f"{self.kind=} must be one of {GATE_KINDS}")
        if self.law not in GATE_LAWS:
            raise ValueError(f"{self.law=} must be one of {GATE_LAWS}")
        if self.kind == "g_gamma" and self.law != "alibi":
            raise ValueError("a g_gamma gate is drawn from ALiBi slopes: use law='alibi'")
        if self.law == "alibi" and not 0 <= self.layer_idx < max(self.num_layers, 1):
            raise ValueError(f"{self.layer_idx=} must lie in [0, {self.num_layers=})")

    @property
    def label(self) -> str:
        if self.law == "alibi":
            body = f"alibi(L{self.num_layers},l{self.layer_idx})"
        else:
            body = f"{self.law}/{_num(self.normalizer)}"
        if self.lower_bound is not None:
            body += f",lb{_num(self.lower_bound)}"
        return f"{self.kind}={body}"


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

    def __post_init__(self):
        if self.gate is not None and not isinstance(self.gate, Gate):
            raise ValueError(f"gate={self.gate!r} must be a Gate or None (a gate-less op)")
        if self.dtype not in DTYPES:
            raise ValueError(f"{self.dtype=} must be one of {tuple(DTYPES)}")
        for name in ("B", "T", "H", "K", "V", "chunk_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}={value!r} must be a positive int")
        if self.dht and not self.final_state:
            raise ValueError("dht=True needs final_state=True: dht is the gradient of ht")
        object.__setattr__(self, "options", tuple(sorted(dict(self.options).items())))
        clash = sorted(set(self.opt) & set(ID_FLAGS))
        if clash:  # an option printed as name=value could read as one of the id's own flags
            raise ValueError(f"options {clash} are names the case id uses for its own flags {ID_FLAGS}; rename them")
        if self.lens is not None:
            self._check_lens()

    def _check_lens(self):
        lens = tuple(self.lens) if isinstance(self.lens, (list, tuple)) else ()
        if not lens or any(not isinstance(n, numbers.Integral) or isinstance(n, bool) or n <= 0 for n in lens):
            raise ValueError(f"lens={self.lens!r} must be a non-empty tuple of positive ints (packed sequence lengths)")
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
    def id(self) -> str:
        """Stable, readable id, e.g.
        ``simple_gla.chunk/B1-T256-H2-K128-V128/bf16/g_gamma=alibi(L32,l0)/C128/h0``; packed sequences
        lead the flags: ``.../C64/lens=37+64+27,h0,dht`` (T = 128 = 37 + 64 + 27, in packing order)."""
        parts = [
            f"{self.op}.{self.variant}",
            f"B{self.B}-T{self.T}-H{self.H}-K{self.K}-V{self.V}",
            DTYPES[self.dtype],
            *([self.gate.label] if self.gate is not None else []),
            f"C{self.chunk_size}",
        ]
        flags = [f"lens={'+'.join(map(str, self.lens))}"] if self.lens is not None else []
        flags += [name for name, on in (("h0", self.h0), ("dht", self.dht)) if on]
        if not self.final_state:
            flags.append("noht")
        if self.scale is not None:
            flags.append(f"scale={_num(self.scale)}")
        if self.seed:
            flags.append(f"seed={self.seed}")
        flags += [f"{k}={_opt(v)}" for k, v in self.options]
        if flags:
            parts.append(",".join(flags))
        return "/".join(parts)

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
        """[N,H,K,V]: the shape of h0, ht, dht and dh0, one state per sequence."""
        return (self.num_seqs, self.H, self.K, self.V)

    @property
    def num_chunks(self) -> int:
        """Chunks of C tokens per batch row; chunks never span a packed sequence boundary (as in fla)."""
        if self.lens is not None:
            return sum(math.ceil(n / self.chunk_size) for n in self.lens)
        return math.ceil(self.T / self.chunk_size)

    def replace(self, **changes) -> "Case":
        return dataclasses.replace(self, **changes)

    def __str__(self) -> str:  # pytest ids and log lines
        return self.id


def _opt(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return _num(v)
    return str(v)
