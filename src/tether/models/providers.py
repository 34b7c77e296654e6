"""Model names with a provider prefix: ``anthropic:NAME``, ``openai:NAME``, ``scripted:PATH``.

A run stores its model as one such name and nothing else about it: keys and base URLs come
from each provider's usual environment variables (``ANTHROPIC_API_KEY`` and
``ANTHROPIC_BASE_URL``; ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL``) whenever the adapter is
made, so a resumed run uses the credentials of the process resuming it. A name without a
prefix is a Claude model's, as before prefixes existed; a prefix tether does not know is an
error naming the ones it does (a model name is never sent to the wrong API).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tether.errors import ConfigError
from tether.extras import needs
from tether.models import ModelAdapter

ANTHROPIC, OPENAI, SCRIPTED = "anthropic", "openai", "scripted"
PROVIDERS = (ANTHROPIC, OPENAI, SCRIPTED)
"""The prefixes tether knows, in the order messages list them."""
KEY_VARIABLES = {
    ANTHROPIC: ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"),
    OPENAI: ("OPENAI_API_KEY",),
}
"""The environment variables each provider's SDK takes its credentials from (any one will do)."""
_PREFIX = re.compile(r"^([A-Za-z][A-Za-z0-9_.-]*):(.*)$", re.DOTALL)


def split_model(spec: str) -> tuple[str, str]:
    """``(provider, name)`` of a model name; a bare name is Anthropic's.

    Raises:
        ConfigError: the prefix is unknown, or the name after it is empty.
    """
    match = _PREFIX.match(spec)
    if match is None:
        return ANTHROPIC, spec
    provider, name = match.group(1).lower(), match.group(2)
    if provider not in PROVIDERS:
        known = ", ".join(f"{known}:" for known in PROVIDERS)
        raise ConfigError(
            f"--model {spec!r}: unknown provider {match.group(1)!r}; known providers are {known} "
            "(a name without a prefix is a Claude model)"
        )
    if not name.strip():
        raise ConfigError(f"--model {spec!r}: the model name after {provider}: is empty")
    return provider, name


def bare_name(spec: str) -> str:
    """The model's own name, without a provider prefix (what prices are looked up by)."""
    match = _PREFIX.match(spec)
    if match is None or match.group(1).lower() not in PROVIDERS:
        return spec
    return match.group(2)


def normalise(spec: str) -> str:
    """``spec`` checked, with a scripted path made absolute (a resume may run elsewhere)."""
    provider, name = split_model(spec)
    if provider == SCRIPTED:
        return f"{SCRIPTED}:{Path(name).resolve()}"
    return spec


def missing_credentials(spec: str) -> str | None:
    """What a model named ``spec`` lacks to be called from this process's environment, or None.

    ``tether run`` asks before it creates a run, so a missing key is one line of advice rather
    than a run failed at its first step. Only the variable is checked: whether the key is
    right, the API says.
    """
    provider, _ = split_model(spec)
    variables = KEY_VARIABLES.get(provider, ())
    if not variables or any(os.environ.get(variable) for variable in variables):
        return None
    if provider == OPENAI:
        return (
            f"--model {spec}: no OpenAI credentials: set OPENAI_API_KEY (a local server that checks none "
            "takes any value); no run was created"
        )
    return (
        f"model {spec}: no Anthropic credentials: set ANTHROPIC_API_KEY, or choose another model with --model "
        "(scripted:PATH runs offline); no run was created"
    )


def model_for(spec: str) -> ModelAdapter:
    """The adapter a model name stands for, configured from the environment (its SDK is imported by its first call).

    Raises:
        ConfigError: an unknown prefix.
        MissingExtra: the provider's SDK comes with an extra that is not installed.
    """
    provider, name = split_model(spec)
    if provider == SCRIPTED:
        from tether.models.scripted import ScriptedModel

        return ScriptedModel.from_file(name)
    if provider == OPENAI:
        with needs("openai", f"--model {spec!r}"):
            from tether.models.openai import OpenAIModel

            return OpenAIModel(name)
    from tether.models.anthropic import AnthropicModel

    return AnthropicModel(name)
