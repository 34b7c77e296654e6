"""What model calls cost: a price table for Claude and OpenAI models, overridable per agent.

Prices are USD per million tokens, by kind: input, output, cache writes (5-minute TTL) and
cache reads. A model is matched by the longest known name prefix, so dated snapshots
(``claude-sonnet-4-5-20250929``) find their family. Unknown models have no price: their
cost is reported as unknown (None) rather than guessed, and cost budgets cannot apply.
Some models bill a long prompt at a higher band (:attr:`Price.long_prompt`): every token of
such a request, output included, is priced at that band.

On the command line a price is ``[MODEL=]INPUT,OUTPUT[,CACHE_WRITE,CACHE_READ]`` (see
:func:`parse_price`); a run started with one keeps it in its spec (:meth:`Price.to_dict`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tether.errors import ConfigError
from tether.facts.usage import Usage
from tether.models.providers import bare_name

CACHE_WRITE_RATIO = 1.25
CACHE_READ_RATIO = 0.1
"""Claude's cache prices relative to input (5-minute writes, reads): the default when only
input and output prices are given."""
PRICE_FORM = "[MODEL=]INPUT,OUTPUT[,CACHE_WRITE,CACHE_READ]"


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: float
    output: float
    cache_write: float
    cache_read: float
    long_prompt: tuple[int, Price] | None = None
    """``(threshold, band)``: a request whose prompt (input + cache writes + cache reads) is
    over ``threshold`` tokens is billed entirely at ``band``."""

    def cost(self, usage: Usage) -> float:
        """The USD cost of one request's ``usage``."""
        if self.long_prompt is not None:
            threshold, band = self.long_prompt
            prompt = usage.input_tokens + usage.cache_creation_input_tokens + usage.cache_read_input_tokens
            if prompt > threshold:
                return band.cost(usage)
        return (
            usage.input_tokens * self.input
            + usage.output_tokens * self.output
            + usage.cache_creation_input_tokens * self.cache_write
            + usage.cache_read_input_tokens * self.cache_read
        ) / 1_000_000

    def to_dict(self) -> dict[str, float]:
        """The stored form (a run's spec); a long-prompt band is not kept (the CLI cannot set one)."""
        return {
            "input": self.input,
            "output": self.output,
            "cache_write": self.cache_write,
            "cache_read": self.cache_read,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Price:
        """The inverse of :meth:`to_dict`; a bad value is a :class:`ConfigError`."""
        try:
            input_, output, cache_write, cache_read = (
                _usd(data[name]) for name in ("input", "output", "cache_write", "cache_read")
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ConfigError(f"invalid price {data!r}: {error}") from None
        return cls(input_, output, cache_write, cache_read)


def _usd(value: Any) -> float:
    """A price per million tokens: a finite number, not negative (a string is read as one)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{value!r} is not a number") from None
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(f"{value!r} must be a number >= 0")
    return number


def parse_price(text: str, *, model: str) -> tuple[str, Price]:
    """``[MODEL=]INPUT,OUTPUT[,CACHE_WRITE,CACHE_READ]`` in USD per million tokens: (model, price).

    Without ``MODEL=`` the price is ``model``'s (the run's); without cache prices they follow
    Claude's ratios to the input price (writes 1.25x, reads 0.1x).
    """
    name, equals, numbers = text.rpartition("=")
    if equals and not name.strip():
        raise ConfigError(f"--price {text!r}: the model name before '=' is empty")
    parts = [part.strip() for part in numbers.split(",")]
    if len(parts) not in (2, 4):
        raise ConfigError(f"--price {text!r}: expected {PRICE_FORM} (USD per million tokens)")
    try:
        values = [_usd(part) for part in parts]
    except ValueError as error:
        raise ConfigError(f"--price {text!r}: {error}") from None
    if len(values) == 2:  # rounded: 3 x 0.1 is 0.3 here, not 0.30000000000000004
        values += [round(values[0] * ratio, 10) for ratio in (CACHE_WRITE_RATIO, CACHE_READ_RATIO)]
    input_, output, cache_write, cache_read = values
    return (name.strip() if equals else model), Price(input_, output, cache_write, cache_read)


PRICES: Mapping[str, Price] = {
    "claude-fable-5-2": Price(8.0, 40.0, 10.0, 0.20),
    "claude-fable-5-1": Price(10.0, 50.0, 12.50, 0.25),
    "claude-fable-5": Price(10.0, 50.0, 12.50, 1.00),
    "claude-opus-5-5": Price(4.0, 20.0, 5.0, 0.20),
    "claude-opus-5": Price(5.0, 25.0, 6.25, 0.50),
    "claude-opus-4-8": Price(5.0, 25.0, 6.25, 0.50),
    "claude-sonnet-5-5": Price(2.0, 10.0, 2.50, 0.10),
    "claude-sonnet-5": Price(2.0, 10.0, 2.50, 0.20),
    "claude-haiku-5-5": Price(0.10, 0.50, 0.125, 0.01, long_prompt=(100_000, Price(0.50, 2.50, 0.625, 0.05))),
    "claude-opus-4-5": Price(5.0, 25.0, 6.25, 0.50),
    "claude-opus-4-1": Price(15.0, 75.0, 18.75, 1.50),
    "claude-opus-4": Price(15.0, 75.0, 18.75, 1.50),
    "claude-sonnet-4-5": Price(3.0, 15.0, 3.75, 0.30),
    "claude-sonnet-4": Price(3.0, 15.0, 3.75, 0.30),
    "claude-3-7-sonnet": Price(3.0, 15.0, 3.75, 0.30),
    "claude-haiku-4-5": Price(1.0, 5.0, 1.25, 0.10),
    "claude-3-5-haiku": Price(0.80, 4.0, 1.0, 0.08),
    # OpenAI (Chat Completions, standard tier). The GPT-6 family bills a request of more than
    # 272K prompt tokens at 2x input and cache, 1.5x output; models with no cache-write charge
    # price writes as input (their usage reports none anyway).
    "gpt-6.2-astra": Price(8.0, 40.0, 10.0, 0.40, long_prompt=(272_000, Price(16.0, 60.0, 20.0, 0.80))),
    "gpt-6.2-sol": Price(2.0, 10.0, 2.50, 0.10, long_prompt=(272_000, Price(4.0, 15.0, 5.0, 0.20))),
    "gpt-6.1-sol": Price(2.0, 10.0, 2.50, 0.10, long_prompt=(272_000, Price(4.0, 15.0, 5.0, 0.20))),
    "gpt-6-astra": Price(10.0, 50.0, 12.50, 1.00, long_prompt=(272_000, Price(20.0, 75.0, 25.0, 2.00))),
    "gpt-6-sol": Price(2.0, 10.0, 2.50, 0.20, long_prompt=(272_000, Price(4.0, 15.0, 5.0, 0.40))),
    "gpt-6-luna": Price(0.10, 0.50, 0.125, 0.01, long_prompt=(272_000, Price(0.20, 0.75, 0.25, 0.02))),
    "gpt-5.6-sol": Price(4.0, 20.0, 5.0, 0.40),
    "gpt-5.6-terra": Price(2.0, 12.0, 2.50, 0.20),
    "gpt-5.6-luna": Price(0.20, 1.20, 0.25, 0.02),
    "gpt-5.5-pro": Price(30.0, 180.0, 30.0, 3.0),
    "gpt-5.5": Price(5.0, 30.0, 5.0, 0.50),
    "gpt-5.4-pro": Price(30.0, 180.0, 30.0, 3.0),
    "gpt-5.4-mini": Price(0.75, 4.50, 0.75, 0.075),
    "gpt-5.4-nano": Price(0.20, 1.25, 0.20, 0.02),
    "gpt-5.4": Price(2.50, 15.0, 2.50, 0.25),
    "gpt-4.1-mini": Price(0.40, 1.60, 0.40, 0.10),
    "gpt-4.1-nano": Price(0.10, 0.40, 0.10, 0.025),
    "gpt-4.1": Price(2.0, 8.0, 2.0, 0.50),
    "gpt-4o-mini": Price(0.15, 0.60, 0.15, 0.075),
    "gpt-4o": Price(2.50, 10.0, 2.50, 1.25),
}
"""Published list prices of Claude and OpenAI models (as of 2026-11), matched by the model's
own name (``openai:gpt-6-sol`` finds ``gpt-6-sol``); pass ``prices=`` to an Agent to add or change."""


def price_for(model: str, overrides: Mapping[str, Price] | None = None) -> Price | None:
    """The price of ``model``: an exact or longest-prefix match, overrides first.

    A provider prefix (``openai:gpt-6-sol``) is looked up with it first (an override may
    name it), then without.
    """
    for table in (overrides or {}, PRICES):
        for name in dict.fromkeys((model, bare_name(model))):
            price = _matched(table, name)
            if price is not None:
                return price
    return None


def _matched(table: Mapping[str, Price], model: str) -> Price | None:
    if model in table:
        return table[model]
    matches = [name for name in table if model.startswith(name)]
    return table[max(matches, key=len)] if matches else None
