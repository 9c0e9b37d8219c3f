"""``parity mxu-probe``: which rounding the MXU does to each operand of a dot, bit for bit.

Pallas TPU kernels compute single products on the matrix unit: each grid step is one
``[8,128] x [128,128]`` dot whose lhs is diagonal (``a[r, r] = x_r``, every other entry zero), so output
``o[r, j] = x_r * b[r, j]``: exactly one product reaches each output element, and the other 127 terms are
exact zeros. The operands are chosen f32 (or bf16) bit patterns, and each precision the installed jax lowers
for Pallas TPU runs them: ``DEFAULT``, ``HIGH``, ``HIGHEST`` on f32 operands, and two bf16 operands.

Three kinds of probe, each judged against hypotheses computed here with numpy bit operations (exact: pieces
and their products are formed in float64, where they are exact, and rounded to f32 once where the hypothesis
rounds):

- ``lhs``: probe values as the lhs, times powers of two (partners whose bf16 split is the value itself, so
  ``o / p`` is the lhs value the MXU used, whatever happens to the partner): :func:`operand_hypotheses`.
- ``rhs``: the same with the roles swapped.
- ``product``: probe values times probe values (structured and seeded random): :func:`product_hypotheses`,
  i.e. how many bf16 pieces, split how, which piece products, summed in which f32 order.

Per precision and probe kind, the verdict is the hypothesis that matches every probe bit for bit (several,
joined with ``=``, when the probes cannot tell them apart), or ``none`` with the closest hypothesis and its
worst mismatch in f32 ulps.

On a TPU (jax's default backend is ``tpu``) the kernels run natively. Elsewhere it is a dry run: the same
kernels in Pallas TPU interpret mode inside :func:`harness.legs.external.mxu_rounding` (every ``dot_general``
rounded as ``kernels_tpu/mxu.py`` models the MXU), so it describes the model, not a TPU. A dry run first
lowers and compiles each kernel for a real TPU target with libtpu (``--target``, default v6e), and a
precision this jax or libtpu refuses is reported as refused, with the compiler's message, and not run.
"""

from __future__ import annotations

import csv
import itertools
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

EXIT_PASS, EXIT_UNEXPLAINED, EXIT_USAGE = 0, 1, 2
DEFAULT_OUT = Path("reports") / "runs"
CSV_NAME = "mxu-probe.csv"
DEFAULT_TARGET = "v6e"
DRY_RUN_NOTE = "dry run: interpret mode with the MXU model; this describes the model, not a TPU"

M, K, N = 8, 128, 128
"""One grid step's dot: lhs [M, K] (diagonal), rhs [K, N]; row r of a step holds one lhs value and up to N rhs
values."""

PRECISIONS = ("DEFAULT", "HIGH", "HIGHEST", "bf16")
"""The probed dots: f32 operands at each ``lax.Precision``, and bf16 operands (at ``DEFAULT``)."""

PARTNERS = (1.0, -0.5, 8.0)
"""Powers of two that multiply the probe values in the lhs and rhs probes: one significant bit, so every split
of them is the value itself and the product is exact under every hypothesis."""

MASK_HI = 0xFFFF0000


# ------------------------------------------------------------------------------- bits
def f32_bits(x) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


def from_bits(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def bf16_truncate(x) -> np.ndarray:
    """f32 -> the bf16 value with the low 16 bits of the f32 pattern cleared (towards zero), as f32."""
    return from_bits(f32_bits(x) & np.uint32(MASK_HI))


def bf16_nearest_even(x) -> np.ndarray:
    """f32 -> the nearest bf16 value, ties to the even one (finite inputs), as f32."""
    bits = f32_bits(x).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & MASK_HI
    return from_bits(rounded.astype(np.uint32))


ROUNDINGS: dict[str, Callable[[np.ndarray], np.ndarray]] = {"trunc": bf16_truncate, "rne": bf16_nearest_even}
ROUNDING_WORDS = {"trunc": "truncation", "rne": "nearest-even"}


def split_bf16(x, pieces: int, rounding: str) -> list[np.ndarray]:
    """f32 ``x`` as ``pieces`` bf16 values (float64 arrays): each the residual rounded to bf16. Residuals of
    finite f32 values are exact f32 values (their bits lie within x's), checked."""
    rest = np.asarray(x, dtype=np.float32).astype(np.float64)
    out = []
    for _ in range(pieces):
        piece = ROUNDINGS[rounding](rest.astype(np.float32)).astype(np.float64)
        out.append(piece)
        rest = rest - piece
        if not np.array_equal(rest.astype(np.float32).astype(np.float64), rest):
            raise AssertionError("a split residual is not an f32 value")
    return out


def ordered(bits) -> np.ndarray:
    """f32 bit patterns -> integers in the order of the values (adjacent floats differ by 1; +0 and -0 tie)."""
    signed = np.asarray(bits, dtype=np.uint32).view(np.int32).astype(np.int64)
    return np.where(signed < 0, -(signed & 0x7FFFFFFF), signed)


def ulp_distance(got_bits, want_bits) -> np.ndarray:
    """|difference| in f32 ulps (a NaN on either side counts as 2**32)."""
    got, want = np.asarray(got_bits, np.uint32), np.asarray(want_bits, np.uint32)
    nan = np.isnan(from_bits(got)) | np.isnan(from_bits(want))
    return np.where(nan, 2**32, np.abs(ordered(got) - ordered(want)))


def hexbits(bits) -> str:
    return f"0x{int(bits):08X}"


# ------------------------------------------------------------------------------- hypotheses
@dataclass(frozen=True)
class Hypothesis:
    """``predict(x, y)`` -> the f32 bit patterns of the outputs, for probe operands ``x`` (lhs) and ``y``
    (rhs), both f32 arrays."""

    id: str
    description: str
    predict: Callable[[np.ndarray, np.ndarray], np.ndarray]


def _product_bits(xv: np.ndarray, yv: np.ndarray) -> np.ndarray:
    """The f32 rounding (nearest-even) of the exact float64 product of two f32-or-shorter values."""
    return f32_bits((xv.astype(np.float64) * yv.astype(np.float64)).astype(np.float32))


def _operand(rule: Callable[[np.ndarray], np.ndarray], side: str) -> Callable:
    """The hypothesis that ``side``'s operand enters as ``rule(value)`` (float64) and the product is exact
    (the partners of lhs and rhs probes are powers of two: the product is exact in f32)."""
    def predict(x, y):
        xv = rule(x) if side == "lhs" else x.astype(np.float64)
        yv = rule(y) if side == "rhs" else y.astype(np.float64)
        return _product_bits(xv, yv)

    return predict


def _pieces_sum(pieces: int, rounding: str) -> Callable[[np.ndarray], np.ndarray]:
    return lambda v: sum(split_bf16(v, pieces, rounding))


def _fp8(dtype) -> Callable[[np.ndarray], np.ndarray]:
    return lambda v: np.asarray(v, np.float32).astype(dtype).astype(np.float64)


def operand_hypotheses(side: str, kind: str) -> tuple[Hypothesis, ...]:
    """What the MXU might do to one operand (``side``) of a dot of f32 or bf16 (``kind``) operands."""
    if kind == "bf16":
        import ml_dtypes

        rules = [("exact", "used as is (bf16 values are exact)", lambda v: v.astype(np.float64)),
                 ("e4m3-rne", "rounded to fp8 e4m3, nearest-even", _fp8(ml_dtypes.float8_e4m3fn)),
                 ("e5m2-rne", "rounded to fp8 e5m2, nearest-even", _fp8(ml_dtypes.float8_e5m2))]
    else:
        rules = [("exact", "exact f32 (also 3 bf16 pieces, split either way: 24 bits)",
                  lambda v: v.astype(np.float64)),
                 ("bf16-rne", "rounded to bf16, nearest-even", lambda v: bf16_nearest_even(v).astype(np.float64)),
                 ("bf16-trunc", "truncated to bf16", lambda v: bf16_truncate(v).astype(np.float64)),
                 ("2pc-trunc", "split into 2 bf16 pieces by truncation (hi + lo, each truncated)",
                  _pieces_sum(2, "trunc")),
                 ("2pc-rne", "split into 2 bf16 pieces by nearest-even rounding", _pieces_sum(2, "rne"))]
    return tuple(Hypothesis(hid, desc, _operand(rule, side)) for hid, desc, rule in rules)


SPLITS = {  # id -> (pieces per operand, the (i, j) piece products taken, as in lax's bf16_3x / bf16_6x)
    "x3": (2, ((0, 0), (0, 1), (1, 0))),
    "x4": (2, ((0, 0), (0, 1), (1, 0), (1, 1))),
    "x6": (3, tuple((i, j) for i in range(3) for j in range(3) if i + j <= 2)),
    "x9": (3, tuple((i, j) for i in range(3) for j in range(3))),
}
SUMS = {"large1st": "f32 sum, largest terms first", "small1st": "f32 sum, smallest terms first",
        "fused": "exact sum rounded once to f32"}


def _split_product(pairs, pieces: int, rounding: str, order: str) -> Callable:
    # largest first: by combined order i + j, then lhs piece (the program order of lax's bf16_6x); smallest
    # first is its reverse (kernels_tpu.mxu's order)
    terms = sorted(pairs, key=lambda ij: (ij[0] + ij[1], ij[0]))
    if order == "small1st":
        terms = terms[::-1]

    def predict(x, y):
        xs, ys = split_bf16(x, pieces, rounding), split_bf16(y, pieces, rounding)
        products = [xs[i] * ys[j] for i, j in terms]  # 8 x 8 significant bits: exact in float64 and in f32
        if order == "fused":  # every partial sum spans < 53 bits (|sum| < 4|xy|, lsb >= lsb(x) lsb(y)): exact
            return f32_bits(np.sum(products, axis=0).astype(np.float32))
        acc = products[0].astype(np.float32)
        for p in products[1:]:
            acc = (acc + p.astype(np.float32)).astype(np.float32)  # one f32 rounding per addition
        return f32_bits(acc)

    return predict


def product_hypotheses(kind: str) -> tuple[Hypothesis, ...]:
    """What the MXU might compute for one product x*y of f32 or bf16 (``kind``) operands."""
    exact = Hypothesis("exact", "the exact product rounded once to f32", lambda x, y: _product_bits(x, y))
    if kind == "bf16":
        return (exact, Hypothesis("prod-bf16-rne", "the product rounded to bf16, nearest-even",
                                  lambda x, y: f32_bits(bf16_nearest_even(from_bits(_product_bits(x, y))))))
    out = [exact]
    for rounding, word in ROUNDING_WORDS.items():
        rule = ROUNDINGS[rounding]
        out.append(Hypothesis(f"1pass-{rounding}", f"one pass, both operands to bf16 by {word}",
                              lambda x, y, rule=rule: _product_bits(rule(x), rule(y))))
    for (sid, (pieces, pairs)), rounding, order in itertools.product(SPLITS.items(), ROUNDING_WORDS, SUMS):
        if sid == "x9" and order == "fused":  # all nine products of 24-bit pieces, rounded once: "exact"
            continue
        if sid == "x3" and order == "fused":  # the two cross products (at most 2^-7 |xy| each, lsb at least
            continue  # lsb(x) lsb(y)) add exactly, so smallest first rounds once: the same as "fused"
        out.append(Hypothesis(f"{sid}-{rounding}-{order}",
                              f"bf16{sid}: {pieces} pieces by {ROUNDING_WORDS[rounding]}, {len(pairs)} products, "
                              f"{SUMS[order]}", _split_product(pairs, pieces, rounding, order)))
    return tuple(out)


def hypotheses(probe: str, kind: str) -> tuple[Hypothesis, ...]:
    return product_hypotheses(kind) if probe == "product" else operand_hypotheses(probe, kind)


# ------------------------------------------------------------------------------- verdicts
@dataclass(frozen=True)
class Verdict:
    """``matching``: the hypotheses that explain every probe bit for bit. When none does, ``closest`` (fewest
    probes off, then the smallest worst ulp distance) with ``off`` probes off, ``worst_ulps`` and the probe
    index ``worst_probe``."""

    matching: tuple[str, ...]
    closest: str
    off: int
    probes: int
    worst_ulps: int
    worst_probe: int
    expected: np.ndarray = field(repr=False, compare=False)  # bits under matching[0] or closest

    @property
    def explained(self) -> bool:
        return bool(self.matching)

    @property
    def text(self) -> str:
        if self.matching:
            return " = ".join(self.matching)
        return (f"none (closest {self.closest}: {self.off}/{self.probes} probes off, worst {self.worst_ulps} "
                f"ulp)")


def classify(x, y, got_bits, candidates) -> Verdict:
    """Which of ``candidates`` (:class:`Hypothesis`) explain outputs ``got_bits`` of products ``x * y`` bit for
    bit."""
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
    got = np.asarray(got_bits, np.uint32)
    scores = []
    for h in candidates:
        want = h.predict(x, y)
        ulps = ulp_distance(got, want)
        bad = (got != want)
        scores.append((int(bad.sum()), int(ulps.max()) if ulps.size else 0, h.id, want, ulps))
    matching = tuple(s[2] for s in scores if s[0] == 0)
    best = min(scores, key=lambda s: s[:2]) if not matching else next(s for s in scores if s[2] == matching[0])
    return Verdict(matching, best[2], best[0], int(got.size), best[1], int(np.argmax(best[4])) if got.size else -1,
                   best[3])


# ------------------------------------------------------------------------------- probe values
F32_HEADS = (0x3F80, 0x3F81, 0xBF80, 0xBFC1, 0x3FFF, 0x4B23, 0x3A5B, 0xC2F7)
"""Upper 16 bits (sign, exponent, the 7 mantissa bits bf16 keeps): even and odd kept last bit, negative, all
ones (rounding up carries into the exponent), large and small exponents."""
F32_LOWS = (0x0000, 0x0001, 0x007F, 0x0080, 0x0081, 0x00C0, 0x00FF, 0x0100, 0x0180, 0x4000, 0x7F80, 0x7FFF,
            0x8000, 0x8001, 0x8080, 0xC000, 0xFFFF, 0xA5A5, 0x5A5A, 0x40C0)
"""Lower 16 bits (what bf16 drops): below, at and above half at 16 bits (ties included) and at 8 bits (where a
two-piece split's second piece rounds), a bit in each 8-bit chunk."""


def f32_probe_values() -> np.ndarray:
    bits = [(hi << 16) | lo for hi in F32_HEADS for lo in F32_LOWS]
    return from_bits(np.array(bits, dtype=np.uint32))


def bf16_probe_values() -> np.ndarray:
    """bf16 values (as f32) with every kept mantissa pattern at one exponent, and a spread of signs and
    exponents with several significant bits (which an fp8 rounding would change)."""
    every = [0x3F80 | m for m in range(128)]
    spread = [0xBF00 | m for m in range(0, 128, 9)] + [0x4300 | m for m in range(1, 128, 11)] + \
             [0xC1A5, 0x3B17, 0x44FF, 0xBA93]
    return from_bits(np.array([b << 16 for b in every + spread], dtype=np.uint32))


def random_values(kind: str, count: int, seed: int) -> np.ndarray:
    """Seeded values with random mantissa bits, signs and exponents in [2^-12, 2^12)."""
    rng = np.random.default_rng(seed)
    sign = rng.integers(0, 2, count, dtype=np.uint32) << 31
    exponent = rng.integers(127 - 12, 127 + 12, count, dtype=np.uint32) << 23
    mantissa = rng.integers(0, 1 << 23, count, dtype=np.uint32)
    bits = sign | exponent | mantissa
    if kind == "bf16":
        bits &= np.uint32(MASK_HI)
    return from_bits(bits)


def probe_values(kind: str) -> np.ndarray:
    return bf16_probe_values() if kind == "bf16" else f32_probe_values()


def product_operands(kind: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The product probes' lhs and rhs values: 24 of the structured values each (different ones) and 16
    random values each (40 x 40 products)."""
    values = probe_values(kind)
    lhs = np.concatenate([values[::len(values) // 24][:24], random_values(kind, 16, seed)])
    rhs = np.concatenate([values[3::len(values) // 24][:24], random_values(kind, 16, seed + 1)])
    return lhs, rhs


# ------------------------------------------------------------------------------- the probes and their layout
@dataclass
class Layout:
    """Rows of single products: row ``r`` holds lhs value ``xs[r]`` and rhs values ``ys[r]`` (at most N);
    ``probes`` lists (probe kind, row, column) per product, in probe order."""

    xs: list = field(default_factory=list)
    ys: list = field(default_factory=list)
    probes: list = field(default_factory=list)

    def add(self, probe: str, x: float, ys) -> None:
        for start in range(0, len(ys), N):
            chunk = list(ys[start:start + N])
            row = len(self.xs)
            self.xs.append(x)
            self.ys.append(chunk)
            self.probes.extend((probe, row, col) for col in range(len(chunk)))

    def arrays(self, dtype) -> tuple[np.ndarray, np.ndarray]:
        """lhs [G, M, K] (diagonal) and rhs [G, K, N] of the rows, G = ceil(rows / M)."""
        grid = max(1, math.ceil(len(self.xs) / M))
        a = np.zeros((grid, M, K), np.float32)
        b = np.zeros((grid, K, N), np.float32)
        for row, (x, ys) in enumerate(zip(self.xs, self.ys)):
            g, r = divmod(row, M)
            a[g, r, r] = x
            b[g, r, :len(ys)] = ys
        return a.astype(dtype), b.astype(dtype)

    def operands(self, probe: str) -> tuple[np.ndarray, np.ndarray]:
        rows = [(r, c) for p, r, c in self.probes if p == probe]
        return (np.array([self.xs[r] for r, _ in rows], np.float32),
                np.array([self.ys[r][c] for r, c in rows], np.float32))

    def outputs(self, out: np.ndarray, probe: str) -> np.ndarray:
        """The f32 bits of ``probe``'s products in an output [G, M, N]."""
        flat = np.asarray(out, np.float32).reshape(-1, N)
        return f32_bits(np.array([flat[r, c] for p, r, c in self.probes if p == probe], np.float32))


PROBES = ("lhs", "rhs", "product")


def layout(kind: str, seed: int = 0) -> Layout:
    values = probe_values(kind)
    lay = Layout()
    for v in values:  # lhs probes: each value times every partner
        lay.add("lhs", float(v), PARTNERS)
    for p in PARTNERS:  # rhs probes: every partner times all values
        lay.add("rhs", p, [float(v) for v in values])
    lhs, rhs = product_operands(kind, seed)
    for x in lhs:
        lay.add("product", float(x), [float(v) for v in rhs])
    return lay


# ------------------------------------------------------------------------------- kernels
def precision_of(name: str):
    from jax import lax

    return lax.Precision.DEFAULT if name == "bf16" else getattr(lax.Precision, name)


def probe_call(name: str, grid: int, interpret):
    """``f(a, b)``: the probe kernel (one ``[M,K] x [K,N]`` dot per grid step at precision ``name``), a fresh
    function each time, so that it is traced again (the MXU model applies where a dot is traced)."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl

    precision = precision_of(name)

    def kernel(a_ref, b_ref, o_ref):
        o_ref[...] = lax.dot_general(a_ref[...], b_ref[...], (((1,), (0,)), ((), ())), precision=precision,
                                     preferred_element_type=jnp.float32)

    def f(a, b):
        return pl.pallas_call(
            kernel, grid=(grid,),
            in_specs=[pl.BlockSpec((None, M, K), lambda g: (g, 0, 0)),
                      pl.BlockSpec((None, K, N), lambda g: (g, 0, 0))],
            out_specs=pl.BlockSpec((None, M, N), lambda g: (g, 0, 0)),
            out_shape=jax.ShapeDtypeStruct((grid, M, N), jnp.float32),
            interpret=interpret, name=f"mxu_probe_{name.lower()}")(a, b)

    return f


def operand_dtype(name: str):
    import jax.numpy as jnp

    return jnp.bfloat16 if name == "bf16" else jnp.float32


def first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def refusal_for_target(name: str, grid: int, target: str) -> str | None:
    """Lower and compile the probe kernel natively for a real TPU ``target`` (no TPU needed): None when it
    compiles, else who refused it and the first line of their message."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from harness.compile import tpu_compile

    versions = tpu_compile.versions()
    if tpu_compile.libtpu_version() is None:
        return None  # nothing to ask; the caller says the lowering was not checked
    device = tpu_compile.target_device(target)
    sharding = NamedSharding(Mesh(np.array([device]), ("x",)), PartitionSpec())
    dtype = operand_dtype(name)
    structs = (jax.ShapeDtypeStruct((grid, M, K), dtype, sharding=sharding),
               jax.ShapeDtypeStruct((grid, K, N), dtype, sharding=sharding))
    try:
        lowered = jax.jit(probe_call(name, grid, interpret=False)).trace(*structs).lower()
    except Exception as exc:  # noqa: BLE001 - a refusal is the answer
        return f"refused by jax {versions['jax']}'s Pallas TPU lowering: {first_line(exc)}"
    try:
        tpu_compile.compile_lowered(lowered)
    except Exception as exc:  # noqa: BLE001
        return f"refused by libtpu {versions['libtpu']} for {target}: {first_line(exc)}"
    return None


def run_probe_kernel(name: str, a: np.ndarray, b: np.ndarray, native: bool, model=None) -> np.ndarray:
    """The probe kernel's output: natively on a TPU, else in Pallas TPU interpret mode inside ``model()``
    (default :func:`harness.legs.external.mxu_rounding`)."""
    import jax

    grid = a.shape[0]
    if native:
        return np.asarray(jax.jit(probe_call(name, grid, interpret=False))(a, b))
    from jax.experimental.pallas import tpu as pltpu

    if model is None:
        from harness.legs.external import mxu_rounding as model
    jax.clear_caches()  # the model applies at trace time: nothing traced outside it may be reused
    with model():
        call = probe_call(name, grid, interpret=pltpu.InterpretParams(uninitialized_memory="nan"))
        out = np.asarray(jax.jit(call)(a, b))
    jax.clear_caches()
    return out


# ------------------------------------------------------------------------------- the probe
@dataclass
class PrecisionResult:
    precision: str
    refused: str | None = None
    layout: Layout | None = None
    out: np.ndarray | None = None
    verdicts: dict = field(default_factory=dict)  # probe kind -> Verdict


def probe_precision(name: str, native: bool, target: str | None = DEFAULT_TARGET, model=None,
                    seed: int = 0) -> PrecisionResult:
    """Run ``name``'s probes and judge them. ``target``: the real TPU a dry run first compiles the kernel for
    (None: not checked)."""
    kind = "bf16" if name == "bf16" else "f32"
    lay = layout(kind, seed)
    a, b = lay.arrays(operand_dtype(name))
    if not native and target is not None:
        refused = refusal_for_target(name, a.shape[0], target)
        if refused:
            return PrecisionResult(name, refused=refused)
    try:
        out = run_probe_kernel(name, a, b, native, model)
    except Exception as exc:  # noqa: BLE001 - on a TPU the run is where the compilers refuse
        if not native:
            raise
        return PrecisionResult(name, refused=f"did not run on this TPU: {first_line(exc)}")
    result = PrecisionResult(name, layout=lay, out=out)
    for probe in PROBES:
        x, y = lay.operands(probe)
        result.verdicts[probe] = classify(x, y, lay.outputs(out, probe), hypotheses(probe, kind))
    return result


def is_native() -> bool:
    """On a machine with TPU chips attached, the kernels run on them."""
    from harness.compile.tpu_env import tpu_attached

    return tpu_attached()


CSV_COLUMNS = ("precision", "operand", "probe", "lhs_bits", "rhs_bits", "out_bits", "expected_bits", "ulp_off",
               "verdict", "mode", "device", "versions")


def csv_rows(results, provenance: dict):
    """One row per (precision, operand, probe); a refused precision is one row with its reason as verdict.
    ``expected_bits`` and ``ulp_off``: under the verdict's (first) hypothesis, or the closest when none.
    ``provenance``: the ``mode``, ``device`` and ``versions`` columns of every row."""
    for res in results:
        if res.refused:
            yield {"precision": res.precision, "operand": "", "probe": "", "lhs_bits": "", "rhs_bits": "",
                   "out_bits": "", "expected_bits": "", "ulp_off": "", "verdict": res.refused, **provenance}
            continue
        for probe in PROBES:
            verdict = res.verdicts[probe]
            x, y = res.layout.operands(probe)
            got = res.layout.outputs(res.out, probe)
            ulps = ulp_distance(got, verdict.expected)
            x, y = f32_bits(x), f32_bits(y)
            for i in range(len(got)):
                yield {"precision": res.precision, "operand": probe, "probe": i,
                       "lhs_bits": hexbits(x[i]), "rhs_bits": hexbits(y[i]),
                       "out_bits": hexbits(got[i]), "expected_bits": hexbits(verdict.expected[i]),
                       "ulp_off": int(ulps[i]), "verdict": verdict.text, **provenance}


def table(results) -> str:
    """The verdicts, one line per precision; a worst mismatch spelled out below a "none"."""
    lines = [f"{'precision':<10} {'lhs':<16} {'rhs':<16} product"]
    notes = []
    for res in results:
        if res.refused:
            lines.append(f"{res.precision:<10} {res.refused}")
            continue
        v = res.verdicts
        lines.append(f"{res.precision:<10} {v['lhs'].text:<16} {v['rhs'].text:<16} {v['product'].text}")
        for probe in PROBES:
            verdict = v[probe]
            if not verdict.explained:
                x, y = map(f32_bits, res.layout.operands(probe))
                i = verdict.worst_probe
                got = res.layout.outputs(res.out, probe)[i]
                notes.append(f"  {res.precision} {probe}: worst mismatch {hexbits(x[i])} x {hexbits(y[i])} gave "
                             f"{hexbits(got)}, {verdict.closest} expects {hexbits(verdict.expected[i])}")
    return "\n".join(lines + notes)


def legend(results) -> str:
    """The hypotheses named in the table, with their descriptions."""
    named = {}
    for res in results:
        kind = "bf16" if res.precision == "bf16" else "f32"
        for probe, verdict in res.verdicts.items():
            by_id = {h.id: h.description for h in hypotheses(probe, kind)}
            for hid in verdict.matching or (verdict.closest,):
                named.setdefault(f"{hid} ({'product' if probe == 'product' else 'operand'}, {kind})", by_id[hid])
    return "\n".join(f"  {k}: {v}" for k, v in named.items())


def write_csv(path: Path, rows) -> int:
    count = 0
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, CSV_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow(row)
            count += 1
    return count


class ProbeUsageError(ValueError):
    pass


def _out_dir(path) -> Path:
    from harness.run.result_file import OutDirError, writable_dir

    try:
        return writable_dir(path)
    except OutDirError as exc:
        raise ProbeUsageError(str(exc)) from None


def _precisions(text: str | None) -> tuple[str, ...]:
    if not text:
        return PRECISIONS
    names = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    unknown = [p for p in names if p not in PRECISIONS]
    if unknown or not names:
        raise ProbeUsageError(f"unknown precision(s) {unknown or [text]}; choose from {', '.join(PRECISIONS)}")
    return names


def probe(precision: str | None = None, target: str = DEFAULT_TARGET, out=DEFAULT_OUT) -> int:
    """Run the probes, print the table, write ``OUT/mxu-probe.csv``. Exit 0 when every verdict names a
    hypothesis (or a precision is refused), 1 when some probe kind has none, 2 on bad input."""
    from harness.compile import tpu_compile

    try:
        precisions = _precisions(precision)
        if target not in tpu_compile.TARGETS:
            raise ProbeUsageError(f"unknown TPU target {target!r}; choose from {', '.join(tpu_compile.TARGETS)}")
        out = _out_dir(out)
    except ProbeUsageError as exc:
        print(f"parity mxu-probe: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    import jax

    native = is_native()
    versions = tpu_compile.versions()
    if native:
        mode = "native"
        print(f"mxu-probe: native on {jax.devices()[0].device_kind}; " + ", ".join(f"{k} {v}" for k, v in
                                                                              versions.items()))
    else:
        mode = "dry run"
        checked = (f"each kernel first compiled for TPU {target}" if tpu_compile.libtpu_version()
                   else "the TPU lowering not checked (libtpu is not installed)")
        print(f"mxu-probe: {DRY_RUN_NOTE} (harness.legs.external.mxu_rounding, kernels_tpu/mxu.py); {checked}; "
              + ", ".join(f"{k} {v}" for k, v in versions.items()))
    counts = {kind: {p: len(layout(kind).operands(p)[0]) for p in PROBES} for kind in ("f32", "bf16")}
    print("probes per precision: " + "; ".join(f"{kind} operands: " + ", ".join(f"{p} {n}" for p, n in c.items())
                                               for kind, c in counts.items()))
    results = [probe_precision(name, native, target) for name in precisions]
    print(table(results))
    text = legend(results)
    if text:
        print("hypotheses:\n" + text)
    path = out / CSV_NAME
    provenance = {"mode": mode, "versions": "; ".join(f"{k} {v}" for k, v in versions.items()),
                  "device": jax.devices()[0].device_kind if native else "cpu (Pallas TPU interpret mode, MXU model)"}
    count = write_csv(path, csv_rows(results, provenance))
    print(f"mxu-probe: {count} rows -> {path}" + ("" if native else f" ({DRY_RUN_NOTE})"))
    unexplained = any(not v.explained for r in results for v in r.verdicts.values())
    return EXIT_UNEXPLAINED if unexplained else EXIT_PASS
