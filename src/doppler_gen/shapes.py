"""Benchmark problem shapes: the `--shape` syntax, its defaults, and what a shape costs.

A shape is ``KIND[:key=value,...]``; every key has a default, so ``decode`` alone is a shape.

* ``prefill:q=2048,kv=2048,h=32,kvh=8,d=64,causal=1`` runs on the tiled kernels: ``q`` queries
  at the end of ``kv`` keys (``q <= kv``; the queries are the last ``q`` positions, so causal
  masking is bottom-right aligned, as in chunked prefill). ``q`` and ``kv`` default to each other,
  and to 2048 when both are omitted.
* ``decode:kv=8192,h=32,kvh=8,d=64`` runs on the tiled kernels: one query after ``kv`` keys.
* ``tiered:cold=1536,hot=512,h=32,kvh=8,d=64`` runs on the tiered decode kernels: one query
  after ``cold`` contiguous cold-tier keys and a hot ring of ``hot`` keys (2048 in all by
  default).

``h`` is the number of query heads, ``kvh`` of K/V heads (GQA when smaller; must divide ``h``),
``d`` the head dimension. The defaults are a Llama-like model (32 query heads, 8 K/V heads,
head_dim 64). Errors are one line naming the offending token, because a benchmark command line is
typed by hand and a vague "invalid shape" costs a round trip.
"""

from __future__ import annotations

from dataclasses import dataclass

from doppler_gen.cases import CaseSpec
from doppler_gen.errors import DopplerGenError

# Per kind, the keys it takes and their defaults (None: derived, see _resolve).
_KEYS: dict[str, dict[str, int | None]] = {
    "prefill": {"q": None, "kv": None, "h": 32, "kvh": 8, "d": 64, "causal": 1},
    "decode": {"kv": 8192, "h": 32, "kvh": 8, "d": 64},
    "tiered": {"cold": 1536, "hot": 512, "h": 32, "kvh": 8, "d": 64},
}
KINDS = tuple(_KEYS)
FAMILY_OF_KIND = {"prefill": "tiled", "decode": "tiled", "tiered": "tiered"}
DEFAULT_PREFILL_LEN = 2048
# No WebGPU device binds a buffer this large; refusing early avoids building it in numpy first.
MAX_TENSOR_ELEMENTS = 1 << 30

DEFAULT_SHAPES = (
    "prefill:q=2048,kv=2048,h=32,kvh=8,d=64",
    "decode:kv=8192,h=32,kvh=8,d=64",
    "tiered:cold=1536,hot=512,h=32,kvh=8,d=64",
)


class ShapeSyntaxError(DopplerGenError):
    """A --shape the user typed cannot be understood; the message names the bad token."""


@dataclass(frozen=True)
class Shape:
    """One benchmark problem, in the terms both the WebGPU kernels and torch SDPA understand."""

    kind: str  # prefill | decode | tiered
    query_len: int
    kv_len: int  # keys attended in all (tiered: cold + hot)
    num_heads: int
    num_kv_heads: int
    head_dim: int
    causal: bool = True
    cold_len: int = 0
    hot_len: int = 0

    @property
    def family(self) -> str:
        """The kernel family (variants.toml `family`) that can run this shape."""
        return FAMILY_OF_KIND[self.kind]

    @property
    def label(self) -> str:
        """Canonical text: parses back to the same shape, so reports can be re-run verbatim."""
        heads = f"h={self.num_heads},kvh={self.num_kv_heads},d={self.head_dim}"
        if self.kind == "prefill":
            causal = "" if self.causal else ",causal=0"
            return f"prefill:q={self.query_len},kv={self.kv_len},{heads}{causal}"
        if self.kind == "decode":
            return f"decode:kv={self.kv_len},{heads}"
        return f"tiered:cold={self.cold_len},hot={self.hot_len},{heads}"

    def attended_pairs(self) -> int:
        """(query, key) pairs that contribute to the output, per head.

        Causal prefill counts only the unmasked triangle (bottom-right aligned), the convention
        of FlashAttention's benchmarks: a kernel that computes masked scores anyway shows it as
        lower TFLOP/s, which is the truth about that kernel.
        """
        if self.kind != "prefill" or not self.causal:
            return self.query_len * self.kv_len
        history = self.kv_len - self.query_len
        return self.query_len * history + self.query_len * (self.query_len + 1) // 2

    def flops(self) -> int:
        """Useful FLOPs: QKᵀ and PV at two per multiply-add, 4·pairs·h·d (softmax not counted)."""
        return 4 * self.attended_pairs() * self.num_heads * self.head_dim

    def case_spec(self, seed: int = 0) -> CaseSpec:
        """The validation case with this shape, so bench feeds kernels exactly as validate does."""
        common = {
            "name": self.label,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "seed": seed,
        }
        if self.kind == "tiered":
            return CaseSpec(
                **common,
                cold_len=self.cold_len,
                hot_len=self.hot_len,
                hot_start=self.cold_len,
                hot_window=self.hot_len,
                hot_layout=1 if self.hot_len else 0,
                start_pos=self.kv_len - 1,
                is_causal=1,
            )
        return CaseSpec(
            **common,
            query_len=self.query_len,
            kv_len=self.kv_len,
            start_pos=self.kv_len - self.query_len,
            is_causal=int(self.causal),
        )


def parse_shapes(texts: tuple[str, ...] | list[str]) -> list[Shape]:
    """Parse every --shape (the defaults when none is given); duplicates are kept once."""
    shapes: list[Shape] = []
    for text in texts or DEFAULT_SHAPES:
        shape = parse_shape(text)
        if shape not in shapes:
            shapes.append(shape)
    return shapes


def parse_shape(text: str) -> Shape:
    """Parse one ``KIND[:key=value,...]``; raise ShapeSyntaxError naming the bad token."""
    kind, _, body = text.strip().partition(":")
    kind = kind.strip().lower()
    if kind not in _KEYS:
        raise _error(text, f"unknown kind {kind!r} (expected one of {', '.join(KINDS)})")
    values = _key_values(text, kind, body)
    return _resolve(text, kind, values)


def _key_values(text: str, kind: str, body: str) -> dict[str, int]:
    allowed = _KEYS[kind]
    values: dict[str, int] = {}
    for token in (t.strip() for t in body.split(",")) if body.strip() else ():
        key, sep, raw = token.partition("=")
        key = key.strip().lower()
        if not sep or not key:
            raise _error(text, f"{token!r} is not key=value")
        if key not in allowed:
            raise _error(text, f"unknown key {key!r} ({kind} takes {', '.join(allowed)})")
        if key in values:
            raise _error(text, f"key {key!r} given twice")
        values[key] = _integer(text, key, raw.strip())
    return values


def _integer(text: str, key: str, raw: str) -> int:
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        raise _error(text, f"{key}={raw!r} is not an integer") from None
    if key == "causal":
        if value not in (0, 1):
            raise _error(text, f"causal={raw} must be 0 or 1")
    elif key in ("cold", "hot"):
        if value < 0:
            raise _error(text, f"{key}={raw} must not be negative")
    elif value < 1:
        raise _error(text, f"{key}={raw} must be a positive integer")
    return value


def _resolve(text: str, kind: str, given: dict[str, int]) -> Shape:
    values = {key: default for key, default in _KEYS[kind].items() if default is not None}
    values.update(given)
    heads, kv_heads, head_dim = values["h"], values["kvh"], values["d"]
    if heads % kv_heads:
        raise _error(text, f"h={heads} is not a multiple of kvh={kv_heads}")
    if kind == "prefill":
        query = values.get("q", values.get("kv", DEFAULT_PREFILL_LEN))
        keys = values.get("kv", query)
        if query > keys:
            raise _error(
                text, f"q={query} exceeds kv={keys} (the queries are the last q of kv positions)"
            )
        shape = Shape(kind, query, keys, heads, kv_heads, head_dim, causal=bool(values["causal"]))
    elif kind == "decode":
        shape = Shape(kind, 1, values["kv"], heads, kv_heads, head_dim)
    else:
        cold, hot = values["cold"], values["hot"]
        if cold + hot < 1:
            raise _error(text, "cold + hot must be at least 1 key")
        shape = Shape(kind, 1, cold + hot, heads, kv_heads, head_dim, cold_len=cold, hot_len=hot)
    _check_size(text, shape)
    return shape


def _check_size(text: str, shape: Shape) -> None:
    largest = (
        max(shape.query_len * shape.num_heads, shape.kv_len * shape.num_kv_heads) * shape.head_dim
    )
    if largest > MAX_TENSOR_ELEMENTS:
        raise _error(text, f"a tensor of {largest} elements is larger than any WebGPU binding")


def _error(text: str, message: str) -> ShapeSyntaxError:
    return ShapeSyntaxError(f"--shape {text!r}: {message}")
